package trigger

// LastTick is lastTick, for the catch-up window's table test.
var LastTick = lastTick
