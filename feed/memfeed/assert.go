package memfeed

import "github.com/kairos-es/kairos/feed"

// The store and sink satisfy the contract; the compiler checks it here.
var (
	_ feed.Writer[*Tx] = (*Store)(nil)
	_ feed.Reader      = (*Store)(nil)
	_ feed.SyncStore   = (*Store)(nil)
	_ feed.Sink        = (*Sink)(nil)
)
