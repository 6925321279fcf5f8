package ownership_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/telco-platform/coordinator/internal/ownership"
)

// Two replicas race for one bill run; the loser learns who owns it.
func ExampleWithLock() {
	locker := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a", WaitTime: 10 * time.Millisecond})
	defer locker.Close()
	ctx := context.Background()

	var first int64
	err := ownership.WithLock(ctx, locker, "billrun:2026-11", 0, func(ctx context.Context) error {
		lease, _ := ownership.LeaseFromContext(ctx, "billrun:2026-11")
		first = lease.Fence() // max(last+1, the clock in µs): pass it to every fenced write
		fmt.Println("running, fenced:", first > 0)

		// Meanwhile another worker tries the same key and gives up.
		_, err := locker.Acquire(context.Background(), "billrun:2026-11", 0)
		var ae *ownership.AcquireError
		if errors.As(err, &ae) && errors.Is(err, ownership.ErrAlreadyOwned) {
			fmt.Println(ae.Code, ae.Reason, "owner:", ae.Owner)
		}
		return nil
	})
	fmt.Println("done:", err)

	// The next run gets a higher fence.
	lease, _ := locker.Acquire(ctx, "billrun:2026-11", 0)
	fmt.Println("next fence is higher:", lease.Fence() > first)
	_ = lease.Release(ctx)
	// Output:
	// running, fenced: true
	// LOCK_ACQUISITION_FAILED already_owned owner: replica-a
	// done: <nil>
	// next fence is higher: true
}

// An explicit lease ends on its own; the holder learns it through Done.
func ExampleLocker_explicitLease() {
	locker := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a"})
	defer locker.Close()
	ctx := context.Background()

	lease, err := locker.Acquire(ctx, "msisdn-reaper:sweep", 50*time.Millisecond)
	if err != nil {
		panic(err)
	}
	<-lease.Done()
	fmt.Println(lease.Err())
	fmt.Println(errors.Is(lease.Release(ctx), ownership.ErrNotHeld))
	// Output:
	// ownership: lease lost
	// true
}

// Acquiring through the lease's context is reentrant: same fence, one more hold.
func ExampleLeaseFromContext() {
	locker := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a"})
	defer locker.Close()
	ctx := context.Background()

	outer, _ := locker.Acquire(ctx, "billrun:2026-12", 0)
	inner, _ := locker.Acquire(outer.Context(), "billrun:2026-12", 0)
	locks, _ := locker.Locks(ctx)
	fmt.Println(inner.Fence() == outer.Fence(), locks[0].Holds)
	_ = inner.Release(ctx)
	_ = outer.Release(ctx)
	fmt.Println(outer.Err())
	// Output:
	// true 2
	// ownership: lease released
}
