package bench;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.redisson.Redisson;
import org.redisson.api.RLock;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;

/**
 * The Redisson side of bench/cmd/peerbench: the same workloads, run with
 * RLock against the same Redis, printing one JSON object per line with the
 * same keys as the Go harness's Result.
 *
 * <pre>
 *   serve --redis HOST:PORT --duration-ms N --warmup-ms N --hold-work-us N
 *         --lost-watchdog-ms N --trials N      (a, b, c, e on command)
 *   hold  --redis HOST:PORT --n N      (workload d; protocol in hold.go)
 * </pre>
 */
public final class Main {
    private static final String LIB = "redisson";
    private static final long EXPLICIT_LEASE_S = 30;
    private static final long WAIT_S = 5;

    public static void main(String[] args) throws Exception {
        if (args.length == 0) {
            System.err.println("usage: Main serve|hold --redis HOST:PORT ...");
            System.exit(64);
        }
        Map<String, String> o = new HashMap<>();
        for (int i = 1; i + 1 < args.length; i += 2) {
            o.put(args[i].replaceFirst("^--", ""), args[i + 1]);
        }
        String addr = "redis://" + o.getOrDefault("redis", "127.0.0.1:16390");
        try {
            switch (args[0]) {
                case "serve" -> serve(addr, o);
                case "hold" -> hold(addr, Integer.parseInt(o.getOrDefault("n", "10000")));
                default -> {
                    System.err.println("unknown mode " + args[0]);
                    System.exit(64);
                }
            }
        } catch (Throwable t) {
            // Redisson's threads would keep the JVM alive: exit, so the Go
            // harness sees the failure at once.
            t.printStackTrace();
            System.exit(1);
        }
        System.exit(0);
    }

    static RedissonClient client(String addr, long watchdogMs) {
        Config c = new Config();
        c.useSingleServer().setAddress(addr);
        if (watchdogMs > 0) {
            c.setLockWatchdogTimeout(watchdogMs);
        }
        return Redisson.create(c);
    }

    // ------------------------------------------------------------ suite

    /**
     * Runs workloads on command, so that the Go harness can interleave
     * Redisson with the Go libraries round by round: reads "a", "b", "c4",
     * "c32", "e" or "quit" lines on stdin, answers each with result lines and
     * then "end".
     */
    static void serve(String addr, Map<String, String> o) throws Exception {
        long durationMs = Long.parseLong(o.getOrDefault("duration-ms", "3000"));
        long warmupMs = Long.parseLong(o.getOrDefault("warmup-ms", "1000"));
        long holdWorkUs = Long.parseLong(o.getOrDefault("hold-work-us", "1000"));
        long lostWatchdogMs = Long.parseLong(o.getOrDefault("lost-watchdog-ms", "3000"));
        int trials = Integer.parseInt(o.getOrDefault("trials", "5"));

        Map<String, String> versions = new HashMap<>();
        versions.put("java", System.getProperty("java.version") + " (" + System.getProperty("java.vm.name") + ")");
        String rv = Redisson.class.getPackage().getImplementationVersion();
        versions.put("org.redisson:redisson", rv != null ? rv : System.getProperty("redisson.version", "unknown"));
        String jvmOpts = String.join(" ", ManagementFactory.getRuntimeMXBean().getInputArguments());
        versions.put("jvm options", jvmOpts.isEmpty() ? "(defaults)" : jvmOpts);
        System.out.println("{\"versions\":" + json(versions) + "}");
        System.out.println("end");
        System.out.flush();

        RedissonClient r = client(addr, 0);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        boolean warmed = false;
        try {
            for (String line; (line = in.readLine()) != null;) {
                String cmd = line.trim();
                if (cmd.equals("quit")) {
                    break;
                }
                if (!warmed) {
                    // JIT warm-up once, on top of each workload's own.
                    warm(r, "redisson:warmup", warmupMs * 2);
                    warmed = true;
                }
                switch (cmd) {
                    case "a" -> emit(uncontended(r, durationMs, warmupMs));
                    case "b" -> emit(distinct(r, 16, durationMs, warmupMs / 2));
                    case "c4" -> emit(contended(r, 4, durationMs, warmupMs / 2, holdWorkUs));
                    case "c32" -> emit(contended(r, 32, durationMs, warmupMs / 2, holdWorkUs));
                    case "e" -> {
                        RedissonClient rl = client(addr, lostWatchdogMs);
                        try {
                            emit(lost(rl, lostWatchdogMs, trials, false));
                            emit(lost(rl, lostWatchdogMs, trials, true));
                        } finally {
                            rl.shutdown();
                        }
                    }
                    default -> System.err.println("redisson-bench: unknown command " + cmd);
                }
                System.out.println("end");
                System.out.flush();
            }
        } finally {
            r.shutdown();
        }
    }

    static void emit(Map<String, Object> row) {
        System.out.println(json(row));
        System.out.flush();
    }

    static Map<String, Object> row(String workload) {
        Map<String, Object> m = new HashMap<>();
        m.put("library", LIB);
        m.put("workload", workload);
        return m;
    }

    static void warm(RedissonClient r, String key, long ms) {
        RLock l = r.getLock(key);
        long end = System.nanoTime() + ms * 1_000_000L;
        while (System.nanoTime() < end) {
            l.lock(EXPLICIT_LEASE_S, TimeUnit.SECONDS);
            l.unlock();
        }
    }

    /** (a) one thread, one key, lock(lease)+unlock back to back. */
    static Map<String, Object> uncontended(RedissonClient r, long durationMs, long warmupMs) {
        String key = "redisson:a-uncontended";
        warm(r, key, warmupMs);
        RLock l = r.getLock(key);
        long[] lat = new long[2_000_000];
        int n = 0;
        long failures = 0;
        String err = null;
        long start = System.nanoTime();
        long end = start + durationMs * 1_000_000L;
        while (n < lat.length) {
            long t0 = System.nanoTime();
            if (t0 >= end) {
                break;
            }
            try {
                l.lock(EXPLICIT_LEASE_S, TimeUnit.SECONDS);
                l.unlock();
            } catch (RuntimeException e) {
                failures++;
                err = err == null ? e.toString() : err;
                continue;
            }
            lat[n++] = System.nanoTime() - t0;
        }
        double secs = (System.nanoTime() - start) / 1e9;
        long[] s = Arrays.copyOf(lat, n);
        Arrays.sort(s);
        Map<String, Object> m = row("a_uncontended_1w");
        m.put("workers", 1);
        m.put("seconds", secs);
        m.put("ops", n);
        m.put("failures", failures);
        m.put("ops_per_s", n / secs);
        m.put("p50_us", pct(s, 0.50) / 1000.0);
        m.put("p99_us", pct(s, 0.99) / 1000.0);
        m.put("desc", "Redisson RLock.lock(30 s lease) + unlock()");
        if (err != null) {
            m.put("error", err);
        }
        return m;
    }

    /** (b) workers threads, each on its own key. */
    static Map<String, Object> distinct(RedissonClient r, int workers, long durationMs, long warmupMs)
            throws InterruptedException {
        warm(r, "redisson:b-distinct-0", warmupMs);
        long[] counts = new long[workers];
        long[] fails = new long[workers];
        String[] errs = new String[workers];
        long start = System.nanoTime();
        long end = start + durationMs * 1_000_000L;
        List<Thread> ts = new ArrayList<>();
        for (int w = 0; w < workers; w++) {
            final int id = w;
            Thread t = new Thread(() -> {
                RLock l = r.getLock("redisson:b-distinct-" + id);
                while (System.nanoTime() < end) {
                    try {
                        l.lock(EXPLICIT_LEASE_S, TimeUnit.SECONDS);
                        l.unlock();
                        counts[id]++;
                    } catch (RuntimeException e) {
                        fails[id]++;
                        errs[id] = e.toString();
                    }
                }
            });
            ts.add(t);
            t.start();
        }
        for (Thread t : ts) {
            t.join();
        }
        double secs = (System.nanoTime() - start) / 1e9;
        long ops = 0, failures = 0;
        String err = null;
        for (int w = 0; w < workers; w++) {
            ops += counts[w];
            failures += fails[w];
            err = err == null ? errs[w] : err;
        }
        Map<String, Object> m = row("b_distinct_16w");
        m.put("workers", workers);
        m.put("seconds", secs);
        m.put("ops", ops);
        m.put("failures", failures);
        m.put("ops_per_s", ops / secs);
        m.put("desc", "Redisson RLock.lock(30 s lease) + unlock()");
        if (err != null) {
            m.put("error", err);
        }
        return m;
    }

    /**
     * (c) workers threads on one key, each holding it holdWorkUs. Handoff as
     * in the Go harness: from the release start that freed the lock for the
     * waiters to a waiting (other) thread's tryLock returning; re-takes by
     * the releasing thread are counted as self re-acquisitions.
     */
    static Map<String, Object> contended(RedissonClient r, int workers, long durationMs, long warmupMs,
            long holdWorkUs) throws InterruptedException {
        String key = "redisson:c-contended-" + workers;
        warm(r, key, warmupMs);
        Object mu = new Object();
        long[] counts = new long[workers];
        long[] fails = new long[workers];
        String[] errs = new String[workers];
        long[] handoffs = new long[2_000_000];
        int[] nh = {0};
        long[] freeSince = {0};
        int[] lastHolder = {-1};
        long[] selfAgain = {0};
        long[] overlaps = {0};
        int[] inside = {0};
        long start = System.nanoTime();
        long end = start + durationMs * 1_000_000L;
        List<Thread> ts = new ArrayList<>();
        for (int w = 0; w < workers; w++) {
            final int id = w;
            Thread t = new Thread(() -> {
                RLock l = r.getLock(key);
                while (System.nanoTime() < end) {
                    boolean ok;
                    try {
                        long waitMs = Math.min(WAIT_S * 1000, Math.max(1, (end - System.nanoTime()) / 1_000_000L));
                        ok = l.tryLock(waitMs, EXPLICIT_LEASE_S * 1000, TimeUnit.MILLISECONDS);
                    } catch (InterruptedException e) {
                        return;
                    } catch (RuntimeException e) {
                        fails[id]++;
                        errs[id] = e.toString();
                        continue;
                    }
                    if (!ok) {
                        if (System.nanoTime() < end) {
                            fails[id]++;
                        }
                        continue;
                    }
                    long got = System.nanoTime();
                    boolean live = got < end;
                    synchronized (mu) {
                        inside[0]++;
                        if (inside[0] > 1) {
                            overlaps[0]++;
                        }
                        if (live) {
                            if (lastHolder[0] == id) {
                                selfAgain[0]++;
                            } else if (freeSince[0] != 0 && nh[0] < handoffs.length) {
                                handoffs[nh[0]++] = got - freeSince[0];
                            }
                        }
                        if (lastHolder[0] != id) {
                            freeSince[0] = 0;
                        }
                        lastHolder[0] = id;
                    }
                    sleepMicros(holdWorkUs); // the work done under the lock
                    synchronized (mu) {
                        inside[0]--;
                        if (freeSince[0] == 0) {
                            freeSince[0] = System.nanoTime();
                        }
                    }
                    if (System.nanoTime() < end) {
                        counts[id]++;
                    }
                    try {
                        l.unlock();
                    } catch (RuntimeException e) {
                        fails[id]++;
                        errs[id] = e.toString();
                    }
                }
            });
            ts.add(t);
            t.start();
        }
        for (Thread t : ts) {
            t.join();
        }
        double secs = durationMs / 1000.0;
        long ops = 0, failures = 0, mn = Long.MAX_VALUE, mx = 0;
        String err = null;
        for (int w = 0; w < workers; w++) {
            ops += counts[w];
            failures += fails[w];
            mn = Math.min(mn, counts[w]);
            mx = Math.max(mx, counts[w]);
            err = err == null ? errs[w] : err;
        }
        long[] s = Arrays.copyOf(handoffs, nh[0]);
        Arrays.sort(s);
        Map<String, Object> m = row(workers == 4 ? "c_contended_4w" : "c_contended_32w");
        m.put("workers", workers);
        m.put("seconds", secs);
        m.put("ops", ops);
        m.put("failures", failures);
        m.put("ops_per_s", ops / secs);
        m.put("handoff_p50_us", pct(s, 0.50) / 1000.0);
        m.put("handoff_p99_us", pct(s, 0.99) / 1000.0);
        m.put("min_per_worker", mn);
        m.put("max_per_worker", mx);
        if (mn > 0) {
            m.put("fairness", (double) mx / mn);
        }
        m.put("overlaps", overlaps[0]);
        if (ops > 0) {
            m.put("self_reacquire", (double) selfAgain[0] / ops);
        }
        m.put("desc", "Redisson RLock.tryLock(5 s wait, 30 s lease) + unlock()");
        if (err != null) {
            m.put("error", err);
        }
        return m;
    }

    static void sleepMicros(long us) {
        try {
            Thread.sleep(us / 1000, (int) (us % 1000) * 1000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /**
     * (e) lock() with the watchdog, delete the key behind the holder's back,
     * and see when the holder can know. Redisson has no notification of a
     * lost lock: its watchdog stops renewing silently. With poll = false the
     * holder does what most code does, nothing, and is given the bound to
     * find out through any means (there is none: recorded as never, after
     * checking the lock really is gone). With poll = true the holder polls
     * isHeldByCurrentThread() every watchdog/3, the same cadence the Go peers'
     * renewal tickers run at.
     */
    static Map<String, Object> lost(RedissonClient r, long watchdogMs, int trials, boolean poll) {
        long boundNs = 3 * watchdogMs * 1_000_000L;
        Map<String, Object> m = row("e_lost_lock");
        if (poll) {
            m.put("library", LIB + " (polling)");
        }
        m.put("bound_ms", (double) boundNs / 1e6);
        m.put("mechanism", poll
                ? "no notification; the holder polls isHeldByCurrentThread() every TTL/3"
                : "none: the watchdog stops renewing silently; no API tells the holder");
        List<Long> det = new ArrayList<>();
        int done = 0;
        int stillGone = 0;
        for (int i = 0; i < trials; i++) {
            String key = "redisson:e-lost-" + (poll ? "p" : "n") + i;
            RLock l = r.getLock(key);
            l.lock();
            long locked = System.nanoTime();
            done++;
            sleepMicros(ThreadLocalRandom.current().nextLong(watchdogMs * 1000 / 3)); // random phase
            r.getKeys().delete(key);
            long deleted = System.nanoTime();
            Long found = null;
            if (poll) {
                // The user's poll ticker runs from the moment the lock was
                // taken, like the Go peers' renewal tickers.
                long periodNs = watchdogMs * 1_000_000L / 3;
                for (long next = locked + periodNs; next - deleted < boundNs; next += periodNs) {
                    long now = System.nanoTime();
                    if (next > now) {
                        sleepMicros((next - now) / 1000);
                    }
                    if (!l.isHeldByCurrentThread()) {
                        found = System.nanoTime() - deleted;
                        break;
                    }
                }
            } else {
                // Nothing to wait on: let the bound pass, then confirm the
                // loss was real and that the watchdog did not bring it back.
                sleepMicros(boundNs / 1000);
                if (!l.isHeldByCurrentThread()) {
                    stillGone++;
                }
            }
            if (found != null) {
                det.add(found);
            }
            try {
                l.unlock();
            } catch (RuntimeException expected) {
                // IllegalMonitorStateException: the lock is gone.
            }
            if (det.isEmpty()) {
                break;
            }
        }
        m.put("trials", done);
        m.put("detected", det.size());
        if (!det.isEmpty()) {
            long[] s = det.stream().mapToLong(Long::longValue).sorted().toArray();
            m.put("detect_p50_ms", pct(s, 0.5) / 1e6);
            m.put("detect_max_ms", pct(s, 1.0) / 1e6);
        }
        if (!poll) {
            m.put("note", "lock confirmed gone in Redis at the bound in " + stillGone + " of " + done + " trials");
        }
        return m;
    }

    // ------------------------------------------------------------- hold

    /** (d) n watchdog-held locks (lock(), default 30 s watchdog). */
    static void hold(String addr, int n) throws Exception {
        RedissonClient r = client(addr, 0);
        long start = System.nanoTime();
        List<RLock> locks = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            RLock l = r.getLock("redisson:d-hold-" + i);
            for (int attempt = 1;; attempt++) {
                try {
                    l.lock();
                    break;
                } catch (RuntimeException e) {
                    // A timeout on a loaded machine: try again, as the Go
                    // child does, up to 3 times.
                    if (attempt == 3) {
                        throw e;
                    }
                }
            }
            locks.add(l);
        }
        System.out.printf(Locale.ROOT, "ready %.3f%n", (System.nanoTime() - start) / 1e9);
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line = in.readLine();
        if (line == null || !line.trim().equals("report")) {
            throw new IllegalStateException("expected report, got " + line);
        }
        int lost = 0;
        int released = 0;
        for (RLock l : locks) {
            if (!l.isHeldByCurrentThread()) {
                lost++;
            }
        }
        for (RLock l : locks) {
            try {
                l.unlock();
                released++;
            } catch (RuntimeException e) {
                // lost lock
            }
        }
        Map<String, Object> rep = new HashMap<>();
        rep.put("goroutines", 0);
        rep.put("lost", lost);
        rep.put("released", released);
        System.out.println(json(rep));
        System.out.flush();
        r.shutdown();
    }

    // ------------------------------------------------------------ helpers

    static long pct(long[] sorted, double q) {
        if (sorted.length == 0) {
            return 0;
        }
        int i = (int) (q * sorted.length + 0.5) - 1;
        i = Math.min(Math.max(i, 0), sorted.length - 1);
        return sorted[i];
    }

    static String json(Map<String, ?> m) {
        StringBuilder b = new StringBuilder("{");
        boolean first = true;
        for (Map.Entry<String, ?> e : m.entrySet()) {
            if (!first) {
                b.append(',');
            }
            first = false;
            b.append(quote(e.getKey())).append(':');
            Object v = e.getValue();
            if (v instanceof Number) {
                double d = ((Number) v).doubleValue();
                b.append(Double.isFinite(d) ? String.format(Locale.ROOT, "%s", v) : "0");
            } else {
                b.append(quote(String.valueOf(v)));
            }
        }
        return b.append('}').toString();
    }

    static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                default -> {
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
            }
        }
        return b.append('"').toString();
    }

    private Main() {
    }
}
