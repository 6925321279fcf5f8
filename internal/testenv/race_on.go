//go:build race

package testenv

// RaceEnabled is true when this binary was built with -race: tests that
// build the coordinator binary build it with -race too, so the race
// detector also watches the processes they start.
const RaceEnabled = true
