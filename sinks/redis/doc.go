// Package redis is a feed.Sink that mirrors a feed into Redis, through
// github.com/redis/go-redis/v9: one key per record under a prefix of the
// user's choosing, the document as a JSON string (or, with EncodingHash, a
// hash of its top-level members), optionally expiring. Applications read it
// with a Reader, which follows the pointer to the live copy.
//
//	s, err := redis.Open(ctx, "redis://cache:6379/0", redis.Options{Prefix: "orders:"})
//	r, err := redis.NewReader(client, redis.Options{Prefix: "orders:"})
//	doc, ok, err := r.Get(ctx, "order/42")
//
// # Key layout
//
// Under Prefix P (which ends with ':'):
//
//	P meta                        a hash: live (the live namespace), floor
//	                              (the live namespace's floor, see # The
//	                              floor), next (the last namespace number
//	                              handed out), and filling:<ns> for a
//	                              resync being filled
//	P <ns>:{<key>}                the document: a string (its JSON text), or a
//	                              hash whose fields are the object's member
//	                              names and whose values are each member's
//	                              JSON text ("Ann" is stored with its quotes,
//	                              so the string "42" and the number 42 stay
//	                              apart and the document reads back exactly)
//	P <ns>:{<key>}:seq            the seq of the version stored, or of the
//	                              deletion that removed it
//
// <ns> is <generation>.<n>: the generation a resync filled it for (0 for the
// copy a new target starts with) and a number unique to it. <key> is the feed
// key byte for byte, except that '%', '{' and '}' are written %25, %7B and
// %7D: so the braces are always a Redis Cluster hash tag holding the whole
// key, and a document and its seq hash to one slot in every namespace. A
// reader outside Go reads `HGET P meta live`, then `GET P<ns>:{<key>}`, then
// `HGET P meta live` again, and reads again when the last two disagree.
//
// # The seq guard
//
// Yes, for documents and tombstones alike. A batch is one server-side
// script (see applyScript) per group of records: it compares each record's
// seq with the stored one and writes the record, its seq beside it, only
// when the stored one is absent or lower, so an older write or tombstone,
// and a batch applied again, change nothing, and two calls racing on a key
// end with the higher seq's version. The comparison and the write are one
// atomic step on the server. The calls of a batch and a read of the pointer
// go in one pipeline: one round trip, as EVALSHA, with the calls the server
// answers NOSCRIPT (a restart, a failover) sent again as EVAL.
//
// A deleted key keeps its seq key, holding the tombstone's seq, which is
// what stops an older write arriving after the delete (the one stale call of
// a worker that lost its lease) from bringing the key back. Those markers are
// bounded the way the SQL sinks' tombstone rows are: a resync fills a fresh
// namespace, which holds only the markers of keys deleted while it was filled,
// and the old namespace goes with all of its markers. Options.TombstoneTTL
// makes them expire sooner; at least MinTombstoneTTL, which outlasts any call
// a worker whose lease lapsed can still have landing. With Options.TTL a
// document's seq expires with it; an older write landing after that would
// write the older version, which then expires in turn.
//
// # The floor
//
// A resync's namespace starts with no seq keys, so the guard alone would let
// the stale call of a worker of the generation before, landing after the
// publish, write a key the new copy does not hold (one the rebuild deleted)
// back into the live copy. So each resync's copy keeps a floor: the lowest
// seq of the first batch it was sent. Records below it are of an older
// generation (seqs are never reset, and the worker fills a copy from the
// start of its generation in seq order, then only moves on) and are dropped
// as a no-op, neither written nor rejected, on the resync's namespace and,
// once it is published, on the live one.
//
// Until the publish, the floor is held by the Resync value: it alone writes
// to its namespace (every other sink writes to the live one, and a later
// OpenResync retires the namespace), and a namespace a crash left filling
// is never published. Publish writes it to the meta hash's floor field in
// the same script that switches live, so every process reads the two
// together: New reads them in its init script, and the pipeline that ends
// each Apply reads them in one HMGET beside its pointer check, so a sink
// that follows the pointer to a new copy learns its floor in the same round
// trip. A namespace's floor never changes once it is live, so the sink
// keeps it with the namespace and drops the records below it before it
// sends anything: the apply script never sees them. That is also why the
// floor needs no key in any other slot: in a cluster a script may touch
// only its own slot's keys, and the meta hash is in one slot, so a script
// could reach the floor only from an argument (which the sink would have to
// read first) or from a copy in every slot (written by every publish); the
// client already holds it, read with the pointer, at no extra cost. A
// resync that was sent nothing is given its floor by the worker through
// Resync.SetFloor (feed.FloorSetter), kept and published the same way.
//
// # Redis Cluster
//
// A script may only touch keys of one slot, so against a ClusterClient a
// batch is split into one script call per slot (the slot of each record's
// hash tag, CRC16 of it modulo 16384), all still in one pipeline, which
// go-redis sends to each slot's node. On one server the whole batch is one
// call, or a few when it passes 512 records or 4 MiB, which bounds how long
// any one call holds the server. The meta hash is one key, so the pointer
// switch is one script in its slot. The tests run on a single server; the
// slot layout is checked by computing slots with Redis's rule.
//
// # Resync and atomic publish
//
// OpenResync opens a new namespace of the generation, recorded as filling in
// the meta hash, in one script that also retires every namespace an earlier,
// unfinished resync left filling (a crash, a worker that lost its lease): so
// a second OpenResync for a crashed resync's generation starts empty, and a
// retired namespace can never be published. Publish switches the meta hash's
// live field to the new namespace in one script: readers see the old copy or
// the new one, never a mix and never none. Keys the new copy does not hold
// are gone from what is served at that instant. Abort retires the namespace
// and touches nothing else. A resync's Apply and Publish on a namespace that
// was retired under it return ErrSuperseded, what the Apply wrote there
// taken out again.
//
// Retired namespaces (the copy a publish replaced, aborted and crashed
// resyncs) are removed in the background by a collector (Sink.Sweep) that
// walks the keyspace with SCAN MATCH P[0-9]* in steps of 1000 and UNLINKs
// what it finds in each step before the next: never KEYS, never one command
// whose cost grows with the data, and UNLINK frees large values off the
// server's main thread. It runs after each OpenResync, Publish and Abort and
// when a sink starts; Close stops it at its next step. It removes only keys
// of the layout above whose namespace is neither live nor filling and was
// opened before it read the meta hash; anything else under the prefix is
// left alone.
//
// A sink in another process that still took the old namespace for the live
// one (a worker that took over after a publish) learns otherwise from the
// pointer read that ends each Apply's pipeline: it takes out what it wrote
// there and applies the batch again to the live copy.
//
// # Readers
//
// Reader.Get and Reader.MGet read the live copy in one round trip and follow
// the pointer when it moved; an MGet reads all its keys from one copy. The
// Reader's doc says how a read that races a publish behaves.
//
// # Rejections and errors
//
// Rejections, each of its record alone, the rest of the batch applied:
//
//   - a document larger than Options.MaxDocumentBytes;
//   - with EncodingHash, a document that is not a JSON object, or an empty
//     one (Redis keeps no empty hash);
//   - a key the application wrote itself with another type than the
//     encoding's (a list where the document goes, anything but a string
//     where its seq goes): WRONGTYPE, and the sink leaves the key alone. A
//     document key the sink wrote under the other encoding (its seq key
//     shows it) is replaced.
//
// Errors, the whole batch retried, of the kinds ErrConnection (refused,
// reset, killed by CLIENT KILL), ErrTimeout, ErrOutOfMemory (OOM),
// ErrReadOnly (READONLY, a replica) and ErrServer (anything else the server
// answers), each also unwrapping to go-redis's own error. A call cut short
// may have applied part of the batch; the guard makes the retry safe.
//
// # Failures
//
// The sink keeps its state in Redis, so a server that may evict any key
// (maxmemory-policy allkeys-*) is refused by New: it could evict the pointer
// or a seq the guard needs. A server that loses its data (a restart without
// persistence, FLUSHALL) loses the meta hash: a running sink's Apply then
// returns ErrNoPointer rather than fill a copy missing everything before.
// A sink started after the loss cannot tell it from a new target: New
// creates the meta hash with an empty live copy, which then lacks what was
// written before the loss. Either way, remove the sink's cursor so the
// worker rebuilds the copy with a resync. Namespace numbers start from the
// server's clock whenever the meta hash is created, so a namespace opened
// after a loss never reuses the name of one left from before it.
package redis
