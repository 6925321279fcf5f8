package interop;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Instant;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import org.redisson.Redisson;
import org.redisson.api.RLock;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;

/**
 * The Redisson side of the mixed-fleet tests (docs/lock.md, "Mixed fleets
 * with Redisson"): one Redisson client that takes and releases RLocks on
 * command, so that one JVM serves a whole set of test scenarios.
 *
 * <pre>
 * Main (--redis redis://HOST:PORT | --cluster HOST:PORT,HOST:PORT,...) [--watchdog-ms N]
 * </pre>
 *
 * Prints {@code ready <client id> <redisson version>} once connected, then
 * reads one command per line on stdin, {@code <worker> <command> [args]}.
 * A worker is a thread of its own, created on first use (an RLock's owner
 * is its thread, so reentrant holds go to one worker); its commands run in
 * order, and the workers run at the same time. Each command answers one
 * line, {@code <worker> ok ...} or {@code <worker> err <exception>}:
 *
 * <pre>
 * lock NAME LEASE_MS             RLock.lock() (LEASE_MS 0: watchdog) or lock(LEASE_MS) -> ok locked AT
 * trylock NAME WAIT_MS LEASE_MS  RLock.tryLock(WAIT_MS, LEASE_MS or -1)               -> ok true|false AT
 * unlock NAME                    RLock.unlock()                                        -> ok unlocked BEFORE AFTER
 * holds NAME                     RLock.getHoldCount()                                  -> ok N
 * owner                          the worker's field in a lock it holds                 -> ok CLIENT_ID:THREAD_ID
 * append FILE TEXT...            appends the line TEXT to FILE (O_APPEND)              -> ok appended
 * </pre>
 *
 * AT, BEFORE and AFTER are the wall clock in microseconds since the epoch:
 * when the call returned (AT, AFTER) or was made (BEFORE). A line
 * {@code quit} (or the end of stdin) shuts the client down and exits 0.
 */
public final class Main {
    private Main() {
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> o = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            o.put(args[i].replaceFirst("^--", ""), args[i + 1]);
        }
        Config c = new Config();
        c.setThreads(2);
        c.setNettyThreads(4);
        c.setLockWatchdogTimeout(Long.parseLong(o.getOrDefault("watchdog-ms", "30000")));
        if (o.containsKey("cluster")) {
            var cs = c.useClusterServers()
                    .setMasterConnectionMinimumIdleSize(1)
                    .setSlaveConnectionMinimumIdleSize(1)
                    .setSubscriptionConnectionMinimumIdleSize(1);
            for (String a : o.get("cluster").split(",")) {
                cs.addNodeAddress("redis://" + a);
            }
        } else if (o.containsKey("redis")) {
            c.useSingleServer().setAddress(o.get("redis"))
                    .setConnectionMinimumIdleSize(1)
                    .setSubscriptionConnectionMinimumIdleSize(1);
        } else {
            System.err.println("usage: Main (--redis redis://HOST:PORT | --cluster HOST:PORT,...) [--watchdog-ms N]");
            System.exit(64);
        }
        RedissonClient r;
        try {
            r = Redisson.create(c);
        } catch (Throwable t) {
            t.printStackTrace();
            System.exit(1);
            return;
        }
        String version = Redisson.class.getPackage().getImplementationVersion();
        say("ready " + r.getId() + " " + (version != null ? version : "unknown"));

        Map<String, ExecutorService> workers = new HashMap<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try {
            for (String line; (line = in.readLine()) != null;) {
                line = line.trim();
                if (line.isEmpty()) {
                    continue;
                }
                if (line.equals("quit")) {
                    break;
                }
                String[] f = line.split(" ", 3);
                if (f.length < 2) {
                    say("? err malformed command: " + line);
                    continue;
                }
                String worker = f[0];
                String[] cmd = (f[1] + (f.length > 2 ? " " + f[2] : "")).split(" ");
                workers.computeIfAbsent(worker, w -> Executors.newSingleThreadExecutor(run -> {
                    Thread t = new Thread(run, "worker-" + w);
                    t.setDaemon(true);
                    return t;
                })).execute(() -> {
                    try {
                        say(worker + " ok " + run(r, cmd));
                    } catch (Throwable t) {
                        say(worker + " err " + t.getClass().getName() + ": " + String.valueOf(t.getMessage()).replace('\n', ' '));
                    }
                });
            }
        } finally {
            for (ExecutorService w : workers.values()) {
                w.shutdownNow();
            }
            r.shutdown();
        }
        System.exit(0);
    }

    static String run(RedissonClient r, String[] cmd) throws InterruptedException, IOException {
        switch (cmd[0]) {
            case "lock": {
                RLock l = r.getLock(cmd[1]);
                long lease = Long.parseLong(cmd[2]);
                if (lease > 0) {
                    l.lock(lease, TimeUnit.MILLISECONDS);
                } else {
                    l.lock();
                }
                return "locked " + now();
            }
            case "trylock": {
                RLock l = r.getLock(cmd[1]);
                long lease = Long.parseLong(cmd[3]);
                boolean got = l.tryLock(Long.parseLong(cmd[2]), lease > 0 ? lease : -1, TimeUnit.MILLISECONDS);
                return got + " " + now();
            }
            case "unlock": {
                long before = now();
                r.getLock(cmd[1]).unlock();
                return "unlocked " + before + " " + now();
            }
            case "holds":
                return String.valueOf(r.getLock(cmd[1]).getHoldCount());
            case "owner":
                return r.getId() + ":" + Thread.currentThread().getId();
            case "append": {
                StringBuilder b = new StringBuilder();
                for (int i = 2; i < cmd.length; i++) {
                    b.append(i > 2 ? " " : "").append(cmd[i]);
                }
                Files.writeString(Path.of(cmd[1]), b.append('\n').toString(), StandardCharsets.UTF_8,
                        StandardOpenOption.CREATE, StandardOpenOption.WRITE, StandardOpenOption.APPEND);
                return "appended";
            }
            default:
                throw new IllegalArgumentException("unknown command " + cmd[0]);
        }
    }

    static long now() {
        Instant i = Instant.now();
        return i.getEpochSecond() * 1_000_000L + i.getNano() / 1_000;
    }

    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }
}
