// Package faults holds Kairos's network fault tests: real workers, a real
// PostgreSQL and real sinks, with a TCP proxy between them that cuts, stalls,
// slows down or black-holes the traffic while the workers run. Each test
// checks the guarantees along the way and at the end: what reached each sink
// (a recording layer logs every call with its worker and lease holder), who
// held each lease when (a trigger on the cursors table logs every change of
// holder and every cursor move with the database's clock), and what the sink
// holds once the writers stop.
//
// The proxy is toxiproxy (github.com/Shopify/toxiproxy/v2), run in-process as
// a library, with two toxics of its own: lose_reply (a reply the server sent
// is dropped and the client's connection closed, for the commit that landed
// but whose answer was lost) and swallow_reply (a reply and all after it go
// nowhere while the connection stays open, for a read whose answer never
// comes on a connection TCP still thinks alive). Its dependencies stay out of
// the library's module: this is a module of its own, which only tests import.
//
// The package has no API; the README's fault matrix lists the tests.
package faults
