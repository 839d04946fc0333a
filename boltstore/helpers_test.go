package boltstore

import (
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// openTest opens a store at path and closes it when the test ends.
func openTest(t testing.TB, path string, opts ...Option) *Store {
	t.Helper()
	s, err := Open(path, opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// fakeClock is a clock that moves only when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// onDisk counts the records and expiry index entries in the file, expired
// or not.
func onDisk(t testing.TB, s *Store) (records, index int) {
	t.Helper()
	err := s.db.View(func(tx *bolt.Tx) error {
		records = tx.Bucket(bucketRecords).Stats().KeyN
		index = tx.Bucket(bucketExpiry).Stats().KeyN
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return records, index
}

// inOverlay counts the records (and deletions) the log holds and the file
// does not yet: those of the overlay, and those of the frozen overlay that
// a checkpoint is committing.
func inOverlay(s *Store) int {
	s.ovMu.RLock()
	defer s.ovMu.RUnlock()
	return len(s.overlay) + len(s.frozen)
}

// dataSize is the size of the data in a store's file: where its pages end
// (the file grows ahead of them).
func dataSize(t *testing.T, db *bolt.DB) (n int64) {
	t.Helper()
	if err := db.View(func(tx *bolt.Tx) error { n = tx.Size(); return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// dataSizeClosed is dataSize of the closed store at path.
func dataSizeClosed(t *testing.T, path string) int64 {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	return dataSize(t, db)
}
