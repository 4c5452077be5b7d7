package file

import (
	"errors"

	"github.com/kairos-es/kairos/feed"
)

func asInvalid(err error, inv **feed.InvalidError) bool { return errors.As(err, inv) }
