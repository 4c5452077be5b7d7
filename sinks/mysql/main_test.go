package mysql

import (
	"io"
	"log"
	"testing"

	gomysql "github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The fault tests close connections under the driver on purpose; its
	// log line for each would bury the tests' own output.
	_ = gomysql.SetLogger(log.New(io.Discard, "", 0))
	goleak.VerifyTestMain(m)
}
