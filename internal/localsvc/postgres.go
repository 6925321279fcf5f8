package localsvc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
)

// PostgresReady is the line a postmaster logs once it accepts connections.
const PostgresReady = "database system is ready to accept connections"

// InitPostgres initialises a throwaway cluster in dir/data (trust
// authentication, superuser postgres, UTF8, no fsync) and returns the data
// directory. Run by root, dir is handed to the postgres OS user, which runs
// initdb (PostgreSQL refuses to run as root); dir must then not sit in a
// directory private to root (t.TempDir's parent is).
func InitPostgres(ctx context.Context, binDir, dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cred, err := postgresUser()
	if err != nil {
		return "", err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return "", err
		}
	}
	data := filepath.Join(dir, "data")
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	runAs(cmd, cred, dir)
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("initdb: %v: %s", err, out)
	}
	return data, nil
}

// PostgresCommand is the postmaster of the cluster in dataDir on
// 127.0.0.1:port (no Unix socket, no fsync, no full-page writes: nothing
// here is meant to survive an OS crash), as the postgres OS user when run
// by root, and told SIGQUIT, its immediate shutdown, if its parent dies.
// settings are further "name=value" server settings; a later one wins
// ("synchronous_commit=off").
func PostgresCommand(binDir, dataDir string, port int, settings ...string) (*exec.Cmd, error) {
	cred, err := postgresUser()
	if err != nil {
		return nil, err
	}
	args := []string{"-D", dataDir, "-p", strconv.Itoa(port)}
	for _, s := range append([]string{"listen_addresses=127.0.0.1", "unix_socket_directories=", "fsync=off",
		"full_page_writes=off", "lc_messages=C", "logging_collector=off"}, settings...) {
		args = append(args, "-c", s)
	}
	cmd := exec.Command(filepath.Join(binDir, "postgres"), args...)
	runAs(cmd, cred, filepath.Dir(dataDir))
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	return cmd, nil
}

// PostgresDSN is the DSN of the postgres database as user postgres.
func PostgresDSN(port int) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
}

// postgresUser is the postgres OS user's credential when this process runs
// as root (nil otherwise).
func postgresUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("%w: running PostgreSQL as root needs the postgres OS user, which the postgresql package creates: install it (apt-get install postgresql) or run as a normal user", ErrMissing)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func runAs(cmd *exec.Cmd, cred *syscall.Credential, dir string) {
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = cred
}

// PostgresBinDir is the directory holding initdb and postgres: dir when set
// (it must hold them), else the newest Debian /usr/lib/postgresql/N/bin,
// else the directory of initdb on PATH. The error, matching ErrMissing,
// says what to install.
func PostgresBinDir(dir string) (string, error) {
	has := func(d string) bool {
		return executable(filepath.Join(d, "initdb")) && executable(filepath.Join(d, "postgres"))
	}
	if dir != "" {
		if !has(dir) {
			return "", missing("initdb and postgres not found in " + dir + ": install PostgreSQL (apt-get install postgresql, or `scripts/services install postgres`)")
		}
		return dir, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	major := func(d string) int { n, _ := strconv.Atoi(filepath.Base(filepath.Dir(d))); return n }
	sort.Slice(dirs, func(i, j int) bool { return major(dirs[i]) > major(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	return "", missing("PostgreSQL's initdb and postgres not found: install PostgreSQL (apt-get install postgresql, or `scripts/services install postgres`)")
}

func missing(what string) error { return fmt.Errorf("%w: %s", ErrMissing, what) }
