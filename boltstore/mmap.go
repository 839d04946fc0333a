//go:build !windows

package boltstore

import "strconv"

// initialMmapSize is how much of the address space bbolt maps for the file
// when it opens it: 10 GiB on 64-bit platforms, as etcd does, and what the
// file needs on 32-bit ones. The map only reserves addresses; memory is
// used by the pages read, as before. bbolt maps the file again only once
// the file outgrows the map (then in steps of 1 GiB).
const initialMmapSize = (10 << 30) * (strconv.IntSize / 64)
