// Package fsync flushes files to disk.
package fsync
