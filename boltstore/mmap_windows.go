package boltstore

// initialMmapSize is what the file needs: on Windows bbolt would grow the
// file to the size of its map.
const initialMmapSize = 0
