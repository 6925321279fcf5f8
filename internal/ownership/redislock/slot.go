package redislock

// slot is the Redis Cluster hash slot of a key: CRC16-XMODEM of its hash tag
// (the text between the first '{' and the next '}', when not empty), mod
// 16384. Renewal batches are grouped by it.
func slot(key string) uint16 {
	if s := indexByte(key, '{'); s >= 0 {
		if e := indexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^key[i]]
	}
	return crc & 16383
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
