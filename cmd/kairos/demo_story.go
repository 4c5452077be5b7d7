package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/kairos-es/kairos/feed"
	"github.com/kairos-es/kairos/read"
)

// The demo's story: orders placed by a handful of customers, each order a
// stream of events; the projection folds them into one document per order,
// and an order once cancelled leaves the read model (a tombstone in the feed).

// demoFeed is the feed the projection writes and the sinks mirror.
const demoFeed feed.FeedName = "orders"

// demoCustomers are few, so that a search for one finds a few dozen orders.
var demoCustomers = []string{"ada", "alan", "barbara", "edsger", "grace", "john", "ken", "leslie", "margaret", "niklaus", "radia", "tony"}

var demoSkus = []string{"lamp", "desk", "chair", "rug", "shelf", "stool", "mirror", "clock"}

// orderEvents are one order's events, in the order they are appended.
type orderEvents struct {
	stream string
	events []demoEvent
}

type demoEvent struct {
	Type string
	Data json.RawMessage
}

// demoOrders makes n events, a whole number of orders but for the last one,
// the same ones every run.
func demoOrders(n int) []orderEvents {
	rng := rand.New(rand.NewPCG(15, 4))
	var out []orderEvents
	for total := 0; total < n; {
		o := orderEvents{stream: fmt.Sprintf("order-%05d", len(out)+1)}
		add := func(typ string, data any) {
			b, _ := json.Marshal(data) // maps of strings and numbers
			o.events = append(o.events, demoEvent{Type: typ, Data: b})
		}
		add("order_placed", map[string]any{"customer": demoCustomers[rng.IntN(len(demoCustomers))]})
		for range 1 + rng.IntN(3) {
			add("item_added", map[string]any{"sku": demoSkus[rng.IntN(len(demoSkus))], "qty": 1 + rng.IntN(4), "price_cents": 500 + 100*rng.IntN(200)})
		}
		switch r := rng.IntN(10); {
		case r == 0:
			add("order_cancelled", map[string]any{})
		case r < 8:
			add("order_paid", map[string]any{})
			if r < 6 {
				add("order_shipped", map[string]any{"carrier": []string{"post", "courier"}[rng.IntN(2)]})
			}
		}
		if total+len(o.events) > n {
			o.events = o.events[:n-total]
		}
		total += len(o.events)
		out = append(out, o)
	}
	return out
}

// order is the read model's document of one order.
type order struct {
	ID         string      `json:"id"`
	Customer   string      `json:"customer"`
	Status     string      `json:"status"`
	Items      []orderItem `json:"items"`
	TotalCents int         `json:"total_cents"`
	Carrier    string      `json:"carrier,omitempty"`
	// ItemCount is version 2 of the projection's addition: the rebuild is
	// what gives every document one.
	ItemCount int `json:"item_count,omitempty"`
}

type orderItem struct {
	Sku        string `json:"sku"`
	Qty        int    `json:"qty"`
	PriceCents int    `json:"price_cents"`
}

// fold applies a batch of events to the documents they touch (current holds
// the ones the read model has, by stream) and returns the documents after
// it, nil for a cancelled order, and the touched streams in first-touch
// order. Both backends' projections are this function around their storage.
func fold(batch []read.Event, version int, current map[string]*order) (map[string]*order, []string, error) {
	next := map[string]*order{}
	var touched []string
	for _, e := range batch {
		o, seen := next[e.Stream]
		if !seen {
			touched = append(touched, e.Stream)
			if c := current[e.Stream]; c != nil {
				cp := *c
				cp.Items = slices.Clone(c.Items)
				o = &cp
			}
		}
		var d struct {
			Customer   string `json:"customer"`
			Sku        string `json:"sku"`
			Qty        int    `json:"qty"`
			PriceCents int    `json:"price_cents"`
			Carrier    string `json:"carrier"`
		}
		if err := json.Unmarshal(e.Data, &d); err != nil {
			return nil, nil, fmt.Errorf("event %d of %s: %w", e.Position, e.Stream, err)
		}
		switch e.Type {
		case "order_placed":
			o = &order{ID: e.Stream, Customer: d.Customer, Status: "placed", Items: []orderItem{}}
		case "item_added":
			if o != nil {
				o.Items = append(o.Items, orderItem{d.Sku, d.Qty, d.PriceCents})
				o.TotalCents += d.Qty * d.PriceCents
			}
		case "order_paid":
			if o != nil {
				o.Status = "paid"
			}
		case "order_shipped":
			if o != nil {
				o.Status, o.Carrier = "shipped", d.Carrier
			}
		case "order_cancelled":
			o = nil
		}
		if o != nil && version >= 2 {
			o.ItemCount = 0
			for _, it := range o.Items {
				o.ItemCount += it.Qty
			}
		}
		next[e.Stream] = o
	}
	return next, touched, nil
}

// changesOf are the feed changes of a fold, one per touched stream.
func changesOf(next map[string]*order, touched []string) ([]feed.Change, error) {
	out := make([]feed.Change, 0, len(touched))
	for _, id := range touched {
		o := next[id]
		if o == nil {
			out = append(out, feed.Delete(feed.Key(id)))
			continue
		}
		doc, err := json.Marshal(o)
		if err != nil {
			return nil, err
		}
		out = append(out, feed.Put(feed.Key(id), doc))
	}
	return out, nil
}
