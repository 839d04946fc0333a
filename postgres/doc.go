// Package postgres is the root of idem's PostgreSQL module: see pggate (the
// commit gate), pgoutbox (the transactional outbox), pgstore (the Store on
// PostgreSQL) and pgtest.
package postgres
