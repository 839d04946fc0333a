package sqsconsumer_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemgo/idem"
	sqsconsumer "github.com/idemgo/idem/consumer/sqs"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/testkit/sqsfake"
)

// The example runs against the package's in-process SQS fake; with real
// SQS, build the client with sqs.NewFromConfig and use the queue URLs of
// your account.
func Example() {
	fake := sqsfake.New("")
	srv := httptest.NewServer(fake)
	defer srv.Close()
	fake.SetBase(srv.URL)
	queueURL := fake.CreateQueue("orders", sqsfake.QueueOptions{})
	dlqURL := fake.CreateQueue("orders-dlq", sqsfake.QueueOptions{})

	client := sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
	})
	store, _ := memstore.New()
	exec, _ := idem.New(store)

	charged := map[string]int{}
	c, err := sqsconsumer.New(client, queueURL, dlqURL, exec,
		func(ctx context.Context, m types.Message) error {
			// The fence orders the owners of a key: pass it to the side
			// effect so that it can reject stale writers.
			if _, ok := idem.FenceFrom(ctx); ok {
				charged[*m.Body]++
			}
			return nil
		},
		sqsconsumer.WithWaitTime(time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}

	// A producer sends order 42 twice (a retry) and order 43 once.
	for _, order := range []string{"order-42", "order-42", "order-43"} {
		fake.Send("orders", order, map[string]sqsfake.MessageAttribute{
			"idempotency-key": {DataType: "String", StringValue: order},
		}, "")
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	for fake.Ops("orders").Deleted < 3 {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done

	fmt.Println("order-42 charged", charged["order-42"], "time(s)")
	fmt.Println("order-43 charged", charged["order-43"], "time(s)")
	fmt.Printf("%+v\n", c.Stats())
	// Output:
	// order-42 charged 1 time(s)
	// order-43 charged 1 time(s)
	// {Processed:2 Replayed:1 Retried:0 DeadLettered:0 Invalid:0 Panics:0 Redelivered:0 Errors:0 Abandoned:0}
}
