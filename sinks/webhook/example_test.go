package webhook_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"sync"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/sinks/webhook"
)

// A receiver behind NewHandler, and a sink delivering to it. The receiver
// keeps each key's seq, so an older record never overwrites a newer one
// (the seq guard is the receiver's), and refuses one key, which the sink
// reports as a rejection for the worker to park.
func ExampleNewHandler() {
	type entry struct {
		seq feed.Seq
		doc string // "" once deleted
	}
	var mu sync.Mutex
	live := map[feed.Key]entry{}
	h, err := webhook.NewHandler([]string{testSecret}, webhook.HandlerOptions{}, func(_ context.Context, d webhook.Delivery) ([]webhook.Rejected, error) {
		mu.Lock()
		defer mu.Unlock()
		var rejected []webhook.Rejected
		if d.Type != webhook.TypeApply {
			return nil, nil // a resync's deliveries would fill a copy aside, with its floor
		}
		for _, r := range d.Records {
			switch {
			case r.Key == "banned":
				rejected = append(rejected, webhook.Rejected{Key: r.Key, Reason: "banned keys are refused"})
			case live[r.Key].seq > r.Seq:
				// older than what is stored: ignored
			default:
				live[r.Key] = entry{seq: r.Seq, doc: string(r.Doc)}
			}
		}
		return rejected, nil
	})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	sink, err := webhook.New(context.Background(), webhook.Options{
		URL: srv.URL, Secrets: []string{testSecret}, Feed: "orders", Sink: "hook",
		AllowLoopback: true, // the receiver runs on this host
	})
	if err != nil {
		panic(err)
	}
	defer sink.Close()
	rejs, err := sink.Apply(context.Background(), []feed.Record{
		{Key: "o-1", Seq: 7, Doc: []byte(`{"total":12}`)},
		{Key: "banned", Seq: 8, Doc: []byte(`{}`)},
	})
	fmt.Println(rejs, err)
	mu.Lock()
	fmt.Println(live["o-1"].doc)
	mu.Unlock()
	// Output:
	// [{banned 8 webhook: banned keys are refused}] <nil>
	// {"total":12}
}
