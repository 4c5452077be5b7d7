// Package kafka is a feed.Sink that mirrors a feed into a compacted Kafka
// topic, through github.com/twmb/franz-go: one record per change, keyed by
// the feed's key, the document as the value, a tombstone as a null value
// (which compaction then deletes), and the package's Reader, which builds
// the live documents from the topic the way every consumer must.
//
//	s, err := kafka.New(ctx, kafka.Options{Brokers: []string{"kafka:9092"}, Feed: "orders", Topic: "orders", Create: true})
//
// # Records
//
// Each record carries three headers: kairos-feed (the feed's name),
// kairos-seq (the record's seq, in decimal) and kairos-generation (the
// generation of the copy it was written to, in decimal; absent in the first
// copy, which no resync made). Records of one key always go to one
// partition, by franz-go's key-hash partitioner (murmur2, as Java clients
// hash), so a key's records are in seq order by offset; never add
// partitions to a copy, which would move keys. The producer is idempotent
// (a batch the client resends after a lost answer is written once, in
// order) and waits for acknowledgements from all in-sync replicas; Apply
// returns only once every record of the batch is acknowledged, so the
// cursor moves only past what the brokers have. Only the sink may write to
// its topics.
//
// # Consumers, and the seq guard
//
// Kafka cannot refuse an older write: a topic takes whatever is produced.
// So the sink does not keep feed.Sink's seq guard on the brokers, and the
// one stale call a worker that lost its lease may still land (see feed.Sink)
// appends older versions after newer ones. Every record says its seq, and a
// consumer must keep, per key, the record with the highest kairos-seq
// header, a null value deleting the key (and remembering its seq); records
// of an equal seq are the same version sent twice. Reader does exactly
// that, from the start of the live copy, and the sink's tests hold it to
// the guard: read through Reader, a stale call changes nothing.
//
// A resync's copy starts empty, so the per-key rule alone would let the
// stale call of a worker of the generation before, landing after the
// publish, bring back a key the new copy does not hold (one the rebuild
// deleted). So each resync's copy has a floor: the lowest seq of the first
// batch it was sent. Seqs are never reset, and the worker fills a copy from
// the start of its generation in seq order and then only moves on, so every
// record below the floor is of an older generation, and a consumer must
// leave it out. The floor is in the pointer record, beside the copy's topic
// and generation: the one record every consumer reads before the copy, and
// the one the brokers never compact away (it is the pointer topic's last),
// written in the same produce that publishes the copy, so a copy and its
// floor are never read apart. A record of the copy itself would not do:
// compaction may drop any record of a copy but each key's last, and the
// floor would be one more key for consumers to skip. Until the publish the
// resync holds the floor: it alone writes to its copy (a later OpenResync
// deletes it), and no one reads a copy before its publish. The sink drops
// the records below the floor of the copy it produces to, unsent (a stale
// sink learns the new copy's floor when it follows the pointer), and Reader
// leaves out those that land all the same (from a build without the floor,
// or a request already on the wire). A resync that was sent nothing is
// given its floor by the worker through SetFloor (feed.FloorSetter), and
// publishes it in the pointer all the same.
//
// What Reader cannot undo is compaction. Compaction keeps each key's last
// record by offset, not by seq, so once a stale record lands after a newer
// one of its key and the log cleaner passes, the newer one is gone and
// every consumer, Reader included, reads the older version until the key
// changes again. The driver bounds each call so that it ends before a rival
// can take a lease row (see feed.Lease's Margin); the window is the one a
// call under an advisory-lock lease, which has no such bound, leaves open.
//
// # Resync
//
// A resync fills a topic of its own, Options.Topic-g<generation>-<8 random
// hex digits>, compacted, with the live copy's partition count, replication
// factor and max.message.bytes. Publish produces one record to the pointer
// topic, Options.Topic+"-live" (compacted, one partition, one key): a JSON
// object {"topic": …, "generation": …, "floor": …} naming the new copy and
// its floor (left out when it has none), and waits for its
// acknowledgement; then it deletes the copy it replaced. Before any
// publish, the live copy is Options.Topic itself.
//
// Readers follow the pointer: Reader reads the pointer topic's last record,
// then that copy from its start; a copy deleted under a read (a publish
// retired it meanwhile) is read again from the new pointer. So Publish is
// atomic for readers through Reader: a read returns the old copy whole or
// the new one, never a mix and never an empty one. A consumer that does
// not use Reader must follow the pointer in the same way, and move to the
// new copy when the pointer topic gets a record.
//
// Apply writes to the copy the pointer named when this Sink value last
// read it, and checks the pointer topic's end offset beside each produce;
// should another process have published since, the batch is produced
// again into the new copy (under its floor) before Apply returns, so it
// never lands only in a retired one; a failure to produce into the
// retired copy, which may be deleted already, is then no error.
//
// OpenResync first deletes every copy of the sink's the pointer does not
// name (left by a resync that crashed or could not abort, or a retired copy
// a publish could not delete), so a resync after a crash starts empty, and
// a crashed worker's late writes to its copy fail (franz-go never asks the
// brokers to create a topic by producing to it). Abort deletes its copy,
// unless the pointer names it (a Publish whose answer was lost). The sink
// owns every topic named Options.Topic, Options.Topic-live and
// Options.Topic-g…; give it a name no one else uses.
//
// # Rejections and errors
//
// Rejections, each of its record alone, the rest of the batch applied:
//
//   - a document larger than MaxDocumentBytes: the live copy's
//     max.message.bytes (read by New; Options.MaxMessageBytes sets it on
//     topics Create makes) less room for the key, the headers and the batch
//     header. Such a record is never sent;
//   - a record the brokers refuse for its contents: MESSAGE_TOO_LARGE,
//     INVALID_RECORD, CORRUPT_MESSAGE, RECORD_LIST_TOO_LARGE,
//     INVALID_RECORD_STATE. Kafka answers per partition's batch, not per
//     record, so the records of such a batch are produced again one at a
//     time, and only a record refused alone is rejected.
//
// Errors, the whole batch retried: everything else. Brokers unreachable, a
// connection cut, timeouts, NOT_ENOUGH_REPLICAS and every other answer
// about the brokers (the client retries retriable ones itself until the
// call's context ends), a topic deleted or not authorized. A call whose
// context ends gives the client a moment to fail the records it has not
// sent, then closes the client, which fails those it is still retrying, so
// nothing of the call goes on after it returns; the next call makes a new
// client (a new producer id). A request already on the wire may still land,
// which only a stale call can make matter (above). A batch retried after
// the brokers had taken part of it produces those records again: a
// consumer may read a key's record twice at the same seq (never an older
// one after a newer, from this call's worker), and compaction keeps one.
//
// # Testing
//
// No Kafka broker can be installed on the machines this package was written
// on. Its tests run against kfake (github.com/twmb/franz-go/pkg/kfake), an
// in-process cluster that speaks the Kafka protocol, one per test; set
// KAIROS_TEST_KAFKA_BROKERS to a comma-separated list of real brokers to
// run the same tests against them. The tests that need a broker to answer
// with a chosen error (kfake's fault injection) skip against a real broker,
// and the harness's rejected key with them.
package kafka
