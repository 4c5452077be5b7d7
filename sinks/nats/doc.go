// Package nats is a feed.Sink that mirrors a feed into NATS JetStream
// key-value buckets, through github.com/nats-io/nats.go and its jetstream
// package: one KV entry per key, which applications read with the Reader
// here, with any KV client, or by consuming the bucket's stream.
//
//	import natssink "github.com/kairos-es/kairos/sinks/nats"
//
//	s, err := natssink.Connect(ctx, "nats://127.0.0.1:4222", natssink.Options{Bucket: "orders"})
//	r, err := natssink.NewReader(ctx, nc, "orders") // nc: the application's *nats.Conn
//	e, ok, err := r.Get(ctx, "order/42")
//
// # Layout
//
// Options.Bucket ("orders") is a small KV bucket holding one key,
// PointerKey, whose value names the bucket of the live copy:
// orders-g<generation>-<8 hex digits>, and whose message carries that
// copy's floor in the header HeaderFloor (see # Guarantees). New makes the
// first copy (generation 0) when there is no pointer yet; each resync makes
// a copy of its own.
//
// A copy is a JetStream KV bucket (a stream KV_<name> over the subjects
// $KV.<name>.>, history 1), not a plain stream with MaxMsgsPerSubject 1 of
// the sink's own design: the two store the same thing the same way, but a
// KV bucket is what the NATS tools and every client's KV API read and
// watch, so applications need nothing of this package to read a copy, and
// the delete markers below mean to them what they mean to the sink.
//
// Each record is one message on $KV.<name>.<EncodeKey(key)>: the document
// as its data, and the headers HeaderFeed, HeaderGeneration and HeaderSeq,
// so that a consumer of the stream can apply the feed's rules itself.
//
// # Keys
//
// A subject token cannot hold '.', '*' or '>' as such, nor whitespace, and
// KV keys allow only ASCII letters, digits and "-/_=.". EncodeKey keeps
// ASCII letters, digits, '-', '_' and '/' as they are and writes every other
// byte as '=' and two upper-case hex digits: "order/42" stays "order/42",
// "a.b" is "a=2Eb", "é" is "=C3=A9". It is reversible (DecodeKey), makes
// one token (no '.' is left), is always a valid KV key, and keeps two keys
// apart that differ in any byte. A 512-byte key is at most 1536 bytes
// encoded, which fits the server's control line (4096 bytes by default)
// with the bucket prefix and the reply subject.
//
// # Deletes
//
// A tombstone is a KV delete (a message with the header KV-Operation: DEL
// and no data), not a purge. With history 1 the marker replaces the
// document either way; the delete marker is the one that keeps the
// record's headers, so the tombstone's seq stays on the subject for the
// guard below. A KV Get answers "not found", a watcher sees a delete, and
// the stream keeps one small message per deleted key until a resync
// publishes a fresh copy, which holds only the markers of keys deleted
// while it was filled. A purge (KV-Operation: PURGE with a rollup) would
// tell watchers the key's history is gone, which is not what a feed delete
// means. Do not run the KV's purge-deletes maintenance on a live copy: a
// marker it removes no longer guards its key against a stale call.
//
// # Guarantees
//
// Seq guard: yes, for documents and tombstones alike. Every publish carries
// Nats-Expected-Last-Subject-Sequence: the stream sequence of the key's
// last message as the sink last saw it (0 for none), so the server stores
// it only if nobody wrote the key since. When that condition fails (the
// server answers "wrong last sequence"), the sink reads the key's last
// message, compares the HeaderSeq it holds with the record's seq, and
// either drops the record (the stored one is as new or newer) or publishes
// it again expecting what it just read, up to a few rounds, after which the
// call is an error. The comparison and the write are therefore one step on
// the server: a stale call and its rival, racing, end with the higher seq.
// A message without HeaderSeq (another writer's) counts as seq 0 and is
// overwritten. The stream sequences the sink learns from its own acks are
// kept as hints (Options.HintKeys per copy), so a key the sink wrote before
// is one conditional publish; a key it has no hint for costs a refused
// publish, a read and a second publish. A hint at or above a record's seq
// drops the record without a round trip: feed seqs on a key only rise.
//
// Floor: a resync's copy starts with no messages, so the guard alone would
// let the stale call of a worker of the generation before, landing after
// the publish (its Apply reads the pointer, which names the new copy),
// write a key the new copy does not hold, one the rebuild deleted. So each
// resync's copy keeps a floor: the lowest seq of the first batch it was
// sent. Records below it are of an older generation (seqs are never reset,
// and the worker fills a copy from the start of its generation in seq
// order, then only moves on) and are dropped unsent, a no-op rather than a
// rejection, on the resync's copy and, once published, on the live one.
// Until the publish the resync holds the floor: it alone writes to its copy
// (every other sink writes to the live one, and a later OpenResync removes
// the copy), and a copy a crash left is never published. Publish writes the
// floor into the pointer's message, as HeaderFloor, in the same conditional
// update that names the copy, so the floor is durable from the instant the
// copy is live and every process reads it with the pointer, in the read
// each Apply already makes: a stale worker in another process is held to
// it as well. The pointer's value stays the bucket's name alone, so KV
// clients read it as before. A resync that was sent nothing is given its
// floor by the worker through SetFloor (feed.FloorSetter), kept and
// published the same way.
//
// Retries: every message has Nats-Msg-Id <seq>-<hash of feed and key>, so a
// retry of a publish the server stored but whose ack was lost is dropped by
// the server's duplicate window (2 minutes for KV buckets), and after it by
// the guard.
//
// Pipelining: a batch is published asynchronously, at most Options.Window
// publishes awaiting their acks at once, and Apply returns only once every
// ack is in, so the cursor moves only past what the server stored. The
// pointer is read once per call.
//
// Publish: atomic. OpenResync first removes every copy of this sink the
// pointer does not name (a crashed or aborted resync's, whatever its
// generation, so a resync after a crash starts empty and the crashed
// worker's late writes fail), then creates a fresh bucket. Publish points
// the pointer at it with a KV update conditional on the pointer's revision
// at OpenResync (a rival that published meanwhile wins, and this Publish is
// an error), then removes the copy it replaced. A Reader that read the
// pointer just before and the old copy just after finds it gone, reads the
// pointer again and reads the new copy: every answer comes from one copy
// whole. Abort removes its own bucket only.
//
// Rejections, each of its record alone, the rest of the batch applied: a
// document larger than MaxDocumentBytes (the server's max payload, 1 MiB by
// default, less the most the sink's headers take), and a message the
// bucket refuses as too large.
//
// Errors, the whole batch retried: everything else. A connection that is
// down or closed, a publish unacked within Options.AckTimeout, a bucket
// that is gone, JetStream unavailable, a key other writers keep changing.
//
// # Faults
//
// A call that returns an error may leave publishes it sent still landing;
// the guard and the message ids make that harmless. Connect's connection
// buffers nothing while it reconnects (nats.ReconnectBufSize(-1)), so a
// publish made while the server is unreachable fails at once instead of
// being sent minutes later; a caller's connection given to New should be
// made the same way.
//
// # Servers
//
// Written for and tested against nats-server 2.9 (2.9.10) with JetStream.
// It uses headers and Nats-Msg-Id (2.2), Nats-Expected-Last-Subject-Sequence
// (2.3), KV buckets (2.6), and the direct get of KV
// buckets made with allow_direct (2.9; older servers answer through the
// stream's message get). It does not use what newer servers add and 2.9
// lacks: per-message TTLs and subject delete markers (2.11), atomic batch
// publish (2.12), the multi-key direct get (2.11),
// Nats-Expected-Last-Subject-Sequence-Subject (2.11).
package nats
