"""What the bench scripts share (deploy/bench/compare): logging, the
children a run starts and stops, free ports, waiting, packages, and facts
about the machine. Python 3 standard library only."""

import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

# Port ranges the project's other tools use: never pick these.
RESERVED_PORTS = [(7100, 7199), (17100, 17199), (27100, 27199)]
# What log lines start with (the script's name).
LOG_NAME = "compare"


def log(msg):
    print(f"[{LOG_NAME} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Interrupted(Exception):
    pass


def on_signal(signum, _frame):
    raise Interrupted(f"signal {signal.Signals(signum).name}")


# --------------------------------------------------------------------------
# Children: every process this script starts is registered here and stopped
# by pid on the way out (servers first asked politely, then killed).


class Children:
    def __init__(self):
        self.procs = []  # (name, Popen, stop_signal)

    def start(self, name, argv, stop_signal=signal.SIGTERM, **kw):
        kw.setdefault("stdin", subprocess.DEVNULL)
        # Own session: a terminal Ctrl-C reaches only this script, which then
        # stops the children in order.
        p = subprocess.Popen(argv, start_new_session=True, **kw)
        self.procs.append((name, p, stop_signal))
        return p

    def stop(self, p, timeout=30):
        for entry in list(self.procs):
            if entry[1] is p:
                self._stop_one(entry[0], p, entry[2], timeout)
                self.procs.remove(entry)  # only once it is stopped
                return

    @staticmethod
    def _stop_one(name, p, sig, timeout):
        if p.poll() is not None:
            return
        try:
            p.send_signal(sig)
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log(f"{name} (pid {p.pid}) did not stop in {timeout}s; killing it")
            p.kill()
            p.wait()
        except ProcessLookupError:
            pass

    def stop_all(self):
        while self.procs:
            name, p, sig = self.procs[-1]
            self._stop_one(name, p, sig, 30)
            self.procs.pop()


CHILDREN = Children()


def run_load(name, argv, timeout, **kw):
    """Runs a load generator to completion; returns (rc, stdout, stderr, secs)."""
    t0 = time.monotonic()
    p = CHILDREN.start(name, argv, stop_signal=signal.SIGKILL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        CHILDREN.stop(p)
        raise RuntimeError(f"{name} ran past {timeout:.0f}s: {shlex.join(argv)}")
    finally:
        CHILDREN.stop(p)
    return p.returncode, out, err, time.monotonic() - t0


# --------------------------------------------------------------------------
# Small helpers


def sh(argv, **kw):
    return subprocess.run(argv, check=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, **kw).stdout


def sh_quiet(argv):
    try:
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


_used_ports = set()


def free_port():
    """A port free for TCP and UDP on 127.0.0.1, outside the reserved ranges."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port in _used_ports or any(lo <= port <= hi for lo, hi in RESERVED_PORTS):
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                u.bind(("127.0.0.1", port))
        except OSError:
            continue
        _used_ports.add(port)
        return port
    raise RuntimeError("no free port found")


def wait_until(what, check, proc, timeout, logfile=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}" + tail(logfile))
        if check():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} not ready after {timeout}s" + tail(logfile))


def tail(path, n=15):
    if not path or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        lines = f.readlines()[-n:]
    return f"; last lines of {path}:\n" + "".join(lines)


def percentile(sorted_values, q):
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, int(round(q * len(sorted_values) + 0.5)) - 1))
    return sorted_values[i]


# --------------------------------------------------------------------------
# Installing Redis and PostgreSQL


def pg_bindir():
    base = "/usr/lib/postgresql"
    if not os.path.isdir(base):
        return None
    versions = sorted((d for d in os.listdir(base) if d.isdigit()), key=int, reverse=True)
    for v in versions:
        b = os.path.join(base, v, "bin")
        if all(os.access(os.path.join(b, x), os.X_OK) for x in ("initdb", "postgres", "pgbench", "psql", "pg_isready")):
            return b
    return None


def redis_present():
    return all(shutil.which(x) for x in ("redis-server", "redis-benchmark", "redis-cli"))


def running_pids(comm):
    pids = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/comm") as f:
                    if f.read().strip() == comm:
                        pids.add(int(d))
            except OSError:
                pass
    return pids


def ensure_packages(want_redis, want_pg, allow_install):
    missing = []
    if want_redis and not redis_present():
        missing += ["redis-server", "redis-tools"]
    if want_pg and pg_bindir() is None:
        missing += ["postgresql", "postgresql-client"]
    if not missing:
        return []
    if not allow_install:
        raise RuntimeError(f"missing {missing} and --no-install was given")
    prefix = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if prefix is None:
        raise RuntimeError(f"missing {missing}; run as root or install them: apt-get install {' '.join(missing)}")
    log(f"installing {' '.join(missing)} with apt-get")
    before = {c: running_pids(c) for c in ("redis-server", "postgres")}
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    t0 = time.monotonic()
    subprocess.run(prefix + ["apt-get", "update", "-q"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    subprocess.run(prefix + ["apt-get", "install", "-y", "-q", "--no-install-recommends"] + missing,
                   check=True, env=env, stdout=subprocess.DEVNULL)
    log(f"installed in {time.monotonic() - t0:.0f}s")
    # A package's post-install script may start its system service (where the
    # init system allows it). That service is ours to stop: we started it.
    for svc, comm in (("redis-server", "redis-server"), ("postgresql", "postgres")):
        if running_pids(comm) - before[comm]:
            log(f"the package started the system {svc} service; stopping it")
            for cmd in (["systemctl", "stop", svc], ["service", svc, "stop"]):
                if shutil.which(cmd[0]) and subprocess.run(prefix + cmd).returncode == 0:
                    break
    return missing


# --------------------------------------------------------------------------
# Small facts


def http_ok(url):
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return 200 <= r.status < 300
    except OSError:
        return False


def dir_bytes(path):
    total = 0
    for base, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(base, name))
            except OSError:
                pass
    return total


def machine():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            mem_kb = int(next(l for l in f if l.startswith("MemTotal")).split()[1])
    except (OSError, StopIteration):
        mem_kb = 0
    return {"nproc": os.cpu_count(), "memory_gib": round(mem_kb / 1024 / 1024, 1),
            "cpu": cpu, "kernel": platform.release(), "os": os_name()}


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError):
        return None


def os_name():
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.system()


def git_rev(root):
    rev = sh_quiet(["git", "-C", root, "rev-parse", "--short=12", "HEAD"]) or "?"
    if sh_quiet(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"]):
        rev += " (with uncommitted changes)"
    return rev
