// Package webhook is a feed.Sink that POSTs a feed's records to an HTTP
// receiver, signed in the Standard Webhooks format, and the receiver's half:
// Verify, Decode and NewHandler. It uses the standard library only.
//
// # Deliveries
//
// Each call becomes one or more deliveries: a POST of a JSON body
//
//	{"type":"apply","feed":"orders","sink":"hook","generation":3,
//	 "records":[{"key":"k1","seq":41,"doc":{…}},{"key":"k2","seq":42,"deleted":true}]}
//
// whose records are in seq order, a document or "deleted":true each. A
// resync.publish may also carry "floor" (see # Guarantees). The
// types are TypeApply (Sink.Apply), and for a resync TypeResyncBegin
// (OpenResync, with the generation), TypeResyncApply (the copy's records),
// TypeResyncPublish and TypeResyncAbort. Every resync delivery carries a
// "resync" id, fresh for each OpenResync, so a receiver builds its new copy
// aside, keyed by that id, swaps it in on resync.publish and drops it on
// resync.abort; a resync.begin for a resync id it already holds, or a second
// OpenResync for the same generation, starts a copy empty. "generation" is
// always set in resync deliveries; in apply deliveries it is the generation
// this Sink value last published, and absent when it has published none (a
// process restarted with its cursor in place), so a receiver must not
// require it there.
//
// A batch is split into deliveries whose bodies each stay within
// Options.MaxBodyBytes; a record whose document is larger than
// Sink.MaxDocumentBytes (the body limit less a fixed reserve for the
// envelope and the longest key) is a rejection, the rest of the batch sent.
// The deliveries of a call go one after another, and the call stops at the
// first that fails: with an error, any earlier ones were applied.
//
// # Signatures
//
// Every delivery has the headers webhook-id, webhook-timestamp (Unix seconds
// of this attempt) and webhook-signature: "v1,<base64 HMAC-SHA256 of
// id.timestamp.body>" under each secret of Options.Secrets (whsec_ and the
// key in base64), space-separated, so a receiver can rotate its secret.
// Verify checks one as the spec says, refusing a timestamp further from its
// clock than the tolerance (a replay).
//
// # Delivery ids
//
// The webhook-id is the same on every retry of the same delivery, so a
// receiver can deduplicate. It is a hash of the feed, the sink, the type,
// the resync id for resync deliveries, and the seqs of the delivery's first
// and last records: nothing of the process, the lease or the time. A new
// lease holder, in another process, reads the same records after the same
// cursor and so derives the same ids. No generation is hashed: seqs are
// unique within a feed across generations, and a restarted process does not
// know its generation. Should the rows of that seq range have changed
// between two sends, only fewer of them can be in it (a key's newer version
// or tombstone takes a seq above the range, and is sent later), so a
// receiver that skips the repeat loses nothing. A resync's deliveries are
// keyed by its resync id, so a resync started again after an abort is never
// mistaken for the one before it.
//
// A receiver that dedupes by id must answer a repeat as it answered the
// first time, rejections included: the repeat may be a retry after the
// first answer was lost, and a record rejected then and not now would be
// neither parked nor stored.
//
// # Answers
//
//   - 2xx: the delivery is applied. Its body may list the records the
//     receiver refuses, {"rejected":[{"key":"k1","reason":"…"}]}, each
//     parked with its reason (a key the delivery did not carry is an error).
//     Any other body, or none, means every record was taken.
//   - 408, 425, 429 and 5xx: an error (*DeliveryError, ErrUnavailable); the
//     worker retries the batch later. Retry-After is read into
//     DeliveryError.RetryAfter and said in the error, as the earliest time
//     to send again, which the sync driver honours (feed.RetryDelayer).
//   - 401, 403, 404, 405, 407, 410, 421, and every 3xx (redirects are never
//     followed): an error too, since they say the endpoint or its
//     credentials are wrong, which every batch would meet; parking on them
//     would move the whole feed into the parked list during a
//     misconfiguration.
//   - 413 to a delivery of several records: the receiver's body limit is
//     below Options.MaxBodyBytes, so the delivery is halved and each half
//     sent, down to single records; a 413 to one record parks it. Each
//     half is a delivery of its own, with its own id (its own first and
//     last seq), derived again the same way on a retry.
//   - Every other 4xx (400, 409, 422, …): the receiver refuses the
//     delivery's records, each parked with the status and a cleaned excerpt
//     of the body (at most 256 bytes).
//   - No answer (refused, reset, Options.Timeout or the worker's deadline
//     passed): an error.
//
// Resync deliveries without records (begin, publish, abort) have nothing to
// park: any answer but 2xx is an error.
//
// # Guarantees
//
//   - Seq guard: the receiver's. Every record carries its seq; a receiver
//     that keeps each key's seq beside its document, tombstones included, and
//     ignores a record older than the stored one keeps feed.Sink's guard.
//     The sink's tests hold such a receiver to it.
//   - Floor: the receiver's too. A resync's copy starts with no seqs, so a
//     late apply delivery of the generation before (from a worker that lost
//     its lease with the delivery in flight) would bring back a key the
//     rebuild removed. A receiver that records, with each copy, the lowest
//     seq of the first resync.apply with records it took for it, and
//     ignores any record below that floor, on the copy and, after
//     resync.publish, on the live copy, keeps feed.Sink's floor. A copy
//     that was sent no record (its generation's feed was empty) has no
//     first batch: its resync.publish then carries "floor":F, the floor the
//     worker gave it (feed.FloorSetter), which the receiver makes the
//     copy's when it has none; the sink sends no record below it to that
//     copy. A receiver that ignores the field works as before, without a
//     floor for such a copy. The sink's tests hold their receiver to it
//     too.
//   - Publish: atomic where the receiver swaps its copy on resync.publish;
//     the sink only delivers the signal.
//   - At least once: a delivery may arrive more than once (a retry, a lease
//     change), always with the same id.
//
// # The SSRF guard
//
// A sink dials through a guard that looks at each address after DNS, just
// before connecting (net.Dialer.Control), so a name resolving to a refused
// address is refused too: loopback unless Options.AllowLoopback; private,
// link-local, unique-local, shared (100.64.0.0/10) and cloud-metadata
// addresses (169.254.169.254, fd00:ec2::/32) unless Options.AllowPrivate;
// unspecified, multicast and broadcast addresses always. A refusal is a
// *BlockedAddressError (ErrBlockedAddress). Proxies from the environment are
// not used, since a proxy would be dialled in the receiver's stead.
//
// # Secrets in the URL
//
// A URL may carry credentials (sent as basic auth) or a token in its query.
// Neither ever appears in an error, a log line or a park reason: the URL is
// shown without credentials and with its query values replaced, and any
// text from elsewhere (a receiver's body, a transport error) has them cut
// out, the credentials also in the base64 form of the Authorization header,
// in one place (the redactor).
//
// # New
//
// New validates Options (naming the field) and opens and closes one TCP
// connection to the receiver, through the guard: DNS, the guard and the
// port are checked before the worker starts, and no HTTP request is sent,
// so a receiver need answer nothing but signed deliveries.
package webhook
