package chaostest

import "github.com/idemgo/idem"

// ClusterSlots is the number of hash slots of a Redis Cluster.
const ClusterSlots = 16384

// KeySlot returns the Redis Cluster hash slot of the record of key: the
// record key's hash tag is the key's digest.
func KeySlot(key idem.Key) int {
	return int(crc16(key.Digest()) % ClusterSlots)
}

// crc16 is the CRC16-CCITT (XMODEM) that Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
