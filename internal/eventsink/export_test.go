package eventsink

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ProduceFunc is the client's Produce.
type ProduceFunc = func(context.Context, *kgo.Record, func(*kgo.Record, error))

// WrapProduce lets a test see, hold or fail every record the sink hands to
// its Kafka client (a fault it injects). Call it before Start.
func WrapProduce(k *Kafka, wrap func(next ProduceFunc) ProduceFunc) {
	k.produce = wrap(k.produce)
}
