package sqsfake_test

import (
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/idemgo/idem/testkit/sqsfake"
)

func setup(t *testing.T) (*sqsfake.Server, *sqs.Client) {
	t.Helper()
	f := sqsfake.New("")
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	f.SetBase(srv.URL)
	return f, sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
		Retryer:      aws.NopRetryer{},
	})
}

func receive(t *testing.T, c *sqs.Client, url string, vis int32) []types.Message {
	t.Helper()
	out, err := c.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{
		QueueUrl: &url, MaxNumberOfMessages: 10, VisibilityTimeout: vis,
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount},
		MessageAttributeNames:       []string{"All"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.Messages
}

// TestVisibilityAndReceipts: receive counts, visibility, receipt handle
// semantics and the redrive policy.
func TestVisibilityAndReceipts(t *testing.T) {
	f, c := setup(t)
	url := f.CreateQueue("q", sqsfake.QueueOptions{DeadLetterQueue: "dlq", MaxReceiveCount: 2})
	f.CreateQueue("dlq", sqsfake.QueueOptions{})
	ctx := t.Context()
	if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &url, MessageBody: aws.String("hello"),
		MessageAttributes: map[string]types.MessageAttributeValue{"k": {DataType: aws.String("String"), StringValue: aws.String("v")}}}); err != nil {
		t.Fatal(err)
	}
	first := receive(t, c, url, 1)
	if len(first) != 1 || *first[0].Body != "hello" || first[0].Attributes["ApproximateReceiveCount"] != "1" || *first[0].MessageAttributes["k"].StringValue != "v" {
		t.Fatalf("first receive: got %+v", first)
	}
	if got := receive(t, c, url, 1); len(got) != 0 {
		t.Fatalf("receive while invisible: got %d messages, want 0", len(got))
	}
	time.Sleep(1100 * time.Millisecond)
	second := receive(t, c, url, 30)
	if len(second) != 1 || second[0].Attributes["ApproximateReceiveCount"] != "2" {
		t.Fatalf("second receive: got %+v", second)
	}
	// The first receipt handle is stale: a visibility change fails, a
	// delete succeeds without deleting.
	stale, err := c.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: &url, Entries: []types.ChangeMessageVisibilityBatchRequestEntry{
		{Id: aws.String("0"), ReceiptHandle: first[0].ReceiptHandle, VisibilityTimeout: 5}}})
	if err == nil && (len(stale.Failed) != 1 || *stale.Failed[0].Code != "ReceiptHandleIsInvalid") {
		t.Fatalf("change visibility with a stale handle: got %+v, want a ReceiptHandleIsInvalid entry", stale)
	}
	var apiErr smithy.APIError
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &url, Entries: []types.DeleteMessageBatchRequestEntry{
		{Id: aws.String("0"), ReceiptHandle: first[0].ReceiptHandle}}}); err != nil {
		t.Fatal(err)
	}
	if got := f.Ops("q").Deleted; got != 0 {
		t.Fatalf("deleted with a stale receipt handle: got %d, want 0", got)
	}
	// The current receipt handle works: visible again at once.
	res, err := c.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: &url, Entries: []types.ChangeMessageVisibilityBatchRequestEntry{
		{Id: aws.String("0"), ReceiptHandle: second[0].ReceiptHandle, VisibilityTimeout: 0}}})
	if err != nil || len(res.Successful) != 1 {
		t.Fatalf("change visibility with the current handle: got %+v, %v", res, err)
	}
	// Third receive: over maxReceiveCount, the message moves to the DLQ.
	if got := receive(t, c, url, 1); len(got) != 0 {
		t.Fatalf("receive over maxReceiveCount: got %d messages, want 0", len(got))
	}
	if got := f.Ops("q").Redriven; got != 1 {
		t.Fatalf("redriven: got %d, want 1", got)
	}
	if got := f.Messages("dlq"); len(got) != 1 || got[0].Body != "hello" {
		t.Fatalf("dead-letter queue: got %+v", got)
	}
	// Errors are API errors with SQS codes.
	_, err = c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url + "-missing")})
	if !errors.As(err, &apiErr) || apiErr.ErrorCode() != "AWS.SimpleQueueService.NonExistentQueue" {
		t.Fatalf("missing queue: got %v", err)
	}
}
