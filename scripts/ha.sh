#!/usr/bin/env bash
# A Postgres cluster that fails over without losing an answered commit:
# three Postgres nodes managed by Patroni in synchronous mode, one etcd
# member holding the leader key, and haproxy sending connections to the
# leader only (Patroni's REST check GET /primary). Everything listens on
# loopback ports chosen free at `up`; configs, data, logs and ports live in
# HA_DIR (default target/ha).
#   scripts/ha.sh install       # installs what is missing (Patroni from PyPI, pinned;
#                               # etcd, haproxy and Postgres from the OS's packages)
#   scripts/ha.sh up            # installs what is missing, starts it all, waits
#                               # for a leader and a synchronous standby, then
#                               # prints DATABASE_URL=postgres://...@127.0.0.1:<haproxy>/seckill
#   scripts/ha.sh status        # patronictl list
#   scripts/ha.sh kill-primary  # SIGKILL to the leader's postmaster; returns at once
#   scripts/ha.sh switchover    # planned switchover to the synchronous standby
#   scripts/ha.sh stop-replicas # stops every standby (its Patroni and its Postgres),
#                               # the synchronous one last; the leader left running alone
#   scripts/ha.sh logs          # the last 40 lines of each log in HA_DIR (etcd, haproxy, each node's Patroni)
#   scripts/ha.sh down          # stops everything and removes HA_DIR
# `up` on an HA_DIR whose cluster is healthy prints its URL again; on one
# left by an earlier run it stops that run's processes and starts afresh.
# Postgres refuses to run as root: as root, every process runs as the
# `postgres` OS user, which owns HA_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

HA_DIR="$(realpath -m "${HA_DIR:-target/ha}")"
SCOPE=seckill
NODES=(node0 node1 node2)
# Marks a directory this script made: `down` removes only such a one.
MARKER=".seckill-ha"
# The OS's Python, for this script's own small programs.
PY=/usr/bin/python3
# Patroni from PyPI, pinned, in a virtualenv of its own (put on the PATH
# below): 3.0 (Debian 12's package) at times left synchronous_standby_names
# naming a standby that had stopped, once its /sync key in etcd was empty,
# so the lone primary's commits waited for ever; 4.0 compares the setting
# Postgres runs with (docs/guide/src/failures.md).
PATRONI_VERSION=4.0.6
PATRONI_VENV="$(realpath -m "${HA_TOOLS:-target/ha-tools}")/patroni-$PATRONI_VERSION"
PATH="$PATRONI_VENV/bin:$PATH"

say() { echo "ha: $*" >&2; }
die() { say "$*"; exit 1; }

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then SUDO="sudo"; fi

# Runs a command as the owner of the cluster: `postgres` when we are root
# (Postgres will not run as root), else ourselves. setpriv execs in place,
# so a background launch's $! is the process itself.
as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        setpriv --reuid=postgres --regid=postgres --init-groups env HOME="$HA_DIR" "$@"
    else
        "$@"
    fi
}

apt_install() {
    command -v apt-get >/dev/null || die "no apt-get: install $* yourself"
    say "installing $* from the OS packages"
    # The package lists may be missing or stale on a fresh machine: update
    # once and retry when a package is not found.
    if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null 2>&1; then
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
    fi
}

pg_bin_dir() { # the newest installed Postgres's binaries (Debian keeps them off the PATH)
    local dir
    dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)"
    [ -n "$dir" ] && [ -x "$dir/postgres" ] && echo "$dir"
}

# The pinned Patroni, installed once (a marker file says the install
# finished); clusters brought up side by side (the tests') wait for it.
# The venv is made from the OS's Python ($PY), never from whichever
# python3 comes first on the PATH: the nodes run as the `postgres` user,
# which cannot reach an interpreter under another user's home (pyenv's).
# The marker names that interpreter; a venv made from another is remade.
patroni_installed() { [ "$(cat "$PATRONI_VENV/.installed" 2>/dev/null)" = "$PY" ]; }
install_patroni() {
    patroni_installed && return
    mkdir -p "$(dirname "$PATRONI_VENV")"
    (
        flock 9
        if ! patroni_installed; then
            say "installing Patroni $PATRONI_VERSION (PyPI) into $PATRONI_VENV"
            rm -rf "$PATRONI_VENV"
            "$PY" -m venv --help >/dev/null 2>&1 || apt_install python3-venv
            "$PY" -m venv "$PATRONI_VENV" || die "cannot make a venv with $PY"
            "$PATRONI_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
                "patroni[etcd3,psycopg3]==$PATRONI_VERSION" || die "installing Patroni failed"
            echo "$PY" >"$PATRONI_VENV/.installed"
        fi
    ) 9>"$PATRONI_VENV.lock"
}

install_missing() {
    local missing=()
    install_patroni
    command -v etcd >/dev/null || missing+=(etcd-server)
    command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
    command -v curl >/dev/null || missing+=(curl)
    command -v psql >/dev/null || missing+=(postgresql-client)
    pg_bin_dir >/dev/null || missing+=(postgresql)
    if [ "${#missing[@]}" -gt 0 ]; then apt_install "${missing[@]}"; fi
}

# Every process of this HA_DIR, one "pid command-line" line each: its
# path in the command line (patroni, the postmasters, etcd, haproxy), or a
# Postgres process working in it (backends, whose titles name no path).
# Never this script's own, nor a shell that merely stands in HA_DIR.
# With a node's name, that node's only: its Patroni (HA_DIR/<node>.yml)
# and its Postgres (HA_DIR/<node>/).
ha_pids() { # [node]
    "$PY" - "$HA_DIR" "$$" "${1:-}" <<'EOF'
import os, sys
home, me = sys.argv[1] + "/", {sys.argv[2], str(os.getpid()), str(os.getppid())}
node = sys.argv[3]
marks = [home + node + "/", home + node + ".yml"] if node else [home]
for pid in filter(str.isdigit, os.listdir("/proc")):
    if pid in me:
        continue
    try:
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
        cmdline = cmdline.replace("\0", " ").strip()
        comm = open(f"/proc/{pid}/comm").read().strip()
        cwd = os.readlink(f"/proc/{pid}/cwd") + "/" if comm == "postgres" else ""
    except OSError:
        continue
    if any(mark in cmdline or cwd.startswith(mark) for mark in marks):
        print(pid, cmdline)
EOF
}

nodes_pids() { # node...: ha_pids of each
    local node
    for node in "$@"; do ha_pids "$node"; done
}

# Stops this HA_DIR's processes: haproxy and the Patroni nodes first
# (SIGTERM: each Patroni stops its Postgres), then etcd and anything left,
# then SIGKILL to whatever did not stop within bounded waits. Processes are
# found afresh each time (a pid file of an earlier boot could name anyone).
stop_all() {
    local pids
    # By program (the line is "pid argv..."; Patroni runs under python3).
    pids="$(ha_pids | awk '$2 ~ /(^|\/)haproxy$/ || $3 ~ /(^|\/)patroni$/ { print $1 }')"
    [ -n "$pids" ] && kill -TERM $pids 2>/dev/null || true
    for _ in $(seq 1 100); do
        [ -z "$(ha_pids | awk '$2 !~ /(^|\/)etcd$/ { print $1 }')" ] && break
        sleep 0.2
    done
    pids="$(ha_pids | awk '{ print $1 }')"
    [ -n "$pids" ] && kill -TERM $pids 2>/dev/null || true
    for _ in $(seq 1 25); do
        [ -z "$(ha_pids)" ] && return 0
        sleep 0.2
    done
    pids="$(ha_pids | awk '{ print $1 }')"
    if [ -n "$pids" ]; then
        say "killing what did not stop: $pids"
        kill -KILL $pids 2>/dev/null || true
        sleep 0.2
    fi
}

# Removes HA_DIR at once by renaming it, and frees its bytes in the
# background: deleting a few hundred MB of fresh WAL can take seconds on a
# busy disk, and nothing waits for them.
remove_dir() {
    [ -e "$HA_DIR" ] || return 0
    [ -e "$HA_DIR/$MARKER" ] || die "$HA_DIR exists but was not made by this script: not touching it"
    local trash
    trash="$(mktemp -d "$HA_DIR.removed.XXXXXX")"
    mv "$HA_DIR" "$trash/"
    setsid rm -rf "$trash" >/dev/null 2>&1 </dev/null &
}

# N loopback ports nobody listens on, held together so they differ. Drawn
# below the kernel's ephemeral range (where port 0 binds land): a test that
# frees a port of its own for a moment (a Redis it restarts) finds it still
# free, however many clusters start beside it.
free_ports() {
    "$PY" - "$1" <<'EOF'
import random, socket, sys
low = 20000
with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
    high = min(int(f.read().split()[0]), 32768)
socks = []
while len(socks) < int(sys.argv[1]):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", random.randrange(low, high)))
        socks.append(s)
    except OSError:
        s.close()
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

load_ports() {
    [ -f "$HA_DIR/ports.env" ] || die "no cluster in $HA_DIR (run scripts/ha.sh up)"
    # shellcheck disable=SC1091
    source "$HA_DIR/ports.env"
}

database_url() { echo "postgres://postgres@127.0.0.1:$HAPROXY_PORT/seckill"; }

# The cluster as the first node that answers its REST API sees it: one
# "name role state" line per member.
members() {
    local port
    for port in $REST_PORTS; do
        if curl -fsS --max-time 1 "http://127.0.0.1:$port/cluster" 2>/dev/null | "$PY" -c '
import json, sys
for m in json.load(sys.stdin).get("members", []):
    print(m["name"], m["role"], m.get("state", ""))'; then
            return 0
        fi
    done
    return 1
}

member_with_role() { # the first member in this role, running; empty if none
    { members 2>/dev/null || true; } | awk -v r="$1" '$2 == r && ($3 == "running" || $3 == "streaming") && !n++ { print $1 }'
}

haproxy_leads_to_primary() { # a write-capable Postgres answers through haproxy
    [ "$(psql -X -At -h 127.0.0.1 -p "$HAPROXY_PORT" -U postgres -d postgres \
        -c 'SELECT pg_is_in_recovery()' 2>/dev/null)" = f ]
}

healthy() {
    [ -n "$(member_with_role leader)" ] && [ -n "$(member_with_role sync_standby)" ] && haproxy_leads_to_primary
}

print_logs() {
    local log
    for log in "$HA_DIR"/*.log; do
        [ -f "$log" ] || continue
        echo "----- $log (last 40 lines)" >&2
        tail -n 40 "$log" >&2
    done
}

write_patroni_config() { # node index: HA_DIR/<node>.yml
    local i="$1" name="${NODES[$1]}"
    local rest="${REST[$i]}" pg="${PG[$i]}"
    cat >"$HA_DIR/$name.yml" <<EOF
# Patroni node $name of the cluster "$SCOPE", written by scripts/ha.sh up
# (rewritten at every fresh up). Ports were free on loopback at that moment.
scope: $SCOPE                     # the cluster's name: the nodes find each other under it in etcd
namespace: /seckill-ha/           # etcd key prefix: another cluster on the same etcd cannot collide with this one
name: $name                       # this node's name in etcd, in patronictl and in haproxy's server list

log:                              # Patroni's own log, on its stderr (HA_DIR/<node>.log)
  level: INFO                     # leader races, demotions and promotions are logged at INFO: what a failover's story needs
  format: '%(asctime)s %(levelname)s: %(message)s'  # millisecond timestamps, to time a failover from the logs

restapi:                          # the node's HTTP API
  listen: 127.0.0.1:$rest         # the REST API that haproxy's check asks (GET /primary) and patronictl drives
  connect_address: 127.0.0.1:$rest  # where the other nodes and patronictl reach this node's API

etcd3:                            # the DCS: where the leader key and the cluster's state live
  hosts: 127.0.0.1:$ETCD_CLIENT_PORT  # the one etcd member (v3 API): holds the leader key, leased for ttl seconds

bootstrap:                        # used once, by the node that creates the cluster
  dcs:                            # written to etcd once by the node that bootstraps, then shared by every node
    ttl: 10                       # the leader key's lease: a leader that cannot renew it for 10 s loses it (default 30): fast failover
    loop_wait: 1                  # seconds between two runs of the HA loop: a crashed primary is noticed within about a second (default 10)
    retry_timeout: 4              # etcd and Postgres calls give up after 4 s, then a primary demotes itself; loop_wait + 2 x retry_timeout <= ttl
    primary_start_timeout: 0      # a crashed primary fails over at once instead of crash-recovering in place for up to 300 s: synchronous mode loses no commit by it
    maximum_lag_on_failover: 1048576  # an asynchronous replica more than 1 MiB behind is never promoted (the synchronous one is never behind a commit)
    synchronous_mode: true        # commits wait for a synchronous standby, and only that standby may be promoted: no answered commit is lost
    synchronous_mode_strict: false  # with no standby left the primary goes on alone (writes stay available); should it then die, nobody is promoted
    synchronous_node_count: 1     # one synchronous standby; the third node is the spare that becomes the next one
    postgresql:                   # Postgres settings every node shares
      use_pg_rewind: true         # a demoted primary rejoins as a replica by rewinding, not by copying everything again
      use_slots: true             # replication slots keep on the primary the WAL each replica still needs
      parameters:                 # postgresql.conf, the same on every node
        wal_level: replica        # WAL enough for streaming replicas
        hot_standby: "on"         # replicas answer reads (checks, patronictl)
        max_wal_senders: 10       # two replicas plus pg_basebackup and pg_rewind, with room
        max_replication_slots: 10 # one slot per replica, with room
        wal_log_hints: "on"       # pg_rewind needs it
        synchronous_commit: "on"  # a commit returns once the synchronous standby has flushed it: what the failover relies on
  initdb:                         # how the first node creates the cluster
    - encoding: UTF8              # the service stores UTF-8 text
    - data-checksums              # torn or corrupted pages are detected, not served

postgresql:                       # this node's own Postgres
  listen: 127.0.0.1:$pg           # loopback only: a local cluster
  connect_address: 127.0.0.1:$pg  # where the replicas and haproxy reach this node's Postgres
  data_dir: $HA_DIR/$name/data    # this node's data, under HA_DIR (down removes it)
  bin_dir: $PG_BIN                # Debian keeps Postgres's binaries off the PATH
  pgpass: $HA_DIR/$name/pgpass    # Patroni writes the replication credentials here for pg_basebackup and pg_rewind
  authentication:                # the roles Patroni connects as (loopback trust: no passwords)
    superuser:                    # Patroni's own checks, promotions and pg_rewind
      username: postgres          # Patroni's own user and the one in DATABASE_URL
    replication:                  # streaming replication and pg_basebackup
      username: replicator        # the replicas stream as this user (Patroni creates it at bootstrap)
  parameters:                     # postgresql.conf settings of this node only
    unix_socket_directories: $HA_DIR/$name  # sockets beside the data, away from the machine's own server's
  pg_hba:                         # loopback only and no passwords: reachable from this machine only
    - local all all trust
    - host replication replicator 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust

watchdog:                         # fencing of a primary whose Patroni stopped running its loop
  mode: "off"                     # no /dev/watchdog here; in production "required" fences a primary whose Patroni froze

tags:                             # what this node may become
  nofailover: false               # every node may be promoted
  noloadbalance: false            # every node may serve reads
  clonefrom: false                # replicas clone from the leader
  nosync: false                   # every node may be the synchronous standby
EOF
}

write_haproxy_config() {
    {
        cat <<EOF
# haproxy in front of the cluster "$SCOPE", written by scripts/ha.sh up:
# one address (127.0.0.1:$HAPROXY_PORT) that always leads to the leader.
global
    maxconn 2000
    # Its log would go to syslog; Patroni's logs tell the failover's story.
defaults
    mode tcp
    timeout connect 1s
    # Pooled Postgres connections sit idle between sales: keep them.
    timeout client 1h
    timeout server 1h
    # A REST check that hangs counts as a failure after a second.
    timeout check 1s
listen postgres
    bind 127.0.0.1:$HAPROXY_PORT
    # Patroni answers 200 on GET /primary only on the node holding the
    # leader key with Postgres running as primary; 503 everywhere else.
    option httpchk GET /primary
    http-check expect status 200
    # ... and Postgres out of recovery: a standby that has just taken the
    # leader key answers 200 while still promoting, and would refuse
    # writes (read-only transaction) to connections sent to it meanwhile.
    # The body's role is what Postgres itself says (pg_is_in_recovery).
    http-check expect rstring "role.: .(master|primary)"
    # Checked every 500 ms (250 ms once a check failed): a demoted or dead
    # leader is out within about a second; a new one is in at its first
    # 200. Marked down, its open connections are cut at once, so no client
    # keeps writing to a node that is no longer the leader.
    default-server inter 500ms fastinter 250ms fall 2 rise 1 on-marked-down shutdown-sessions
EOF
        local i
        for i in 0 1 2; do
            echo "    server ${NODES[$i]} 127.0.0.1:${PG[$i]} maxconn 200 check port ${REST[$i]}"
        done
    } >"$HA_DIR/haproxy.cfg"
}

launch() { # name command...: runs it detached as the owner, logging to HA_DIR/<name>.log
    local name="$1"; shift
    as_owner setsid "$@" >"$HA_DIR/$name.log" 2>&1 </dev/null &
}

wait_until() { # seconds what check...
    local seconds="$1" what="$2"; shift 2
    local deadline=$((SECONDS + seconds))
    until "$@"; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            say "$what: not within ${seconds}s"
            print_logs
            [ -f "$HA_DIR/ports.env" ] && members >&2 || true
            die "up failed; scripts/ha.sh down stops what was started"
        fi
        sleep 0.5
    done
}

etcd_answers() { curl -fsS --max-time 1 "http://127.0.0.1:$ETCD_CLIENT_PORT/health" 2>/dev/null | grep -q '"health":"true"'; }
has_leader() { [ -n "$(member_with_role leader)" ]; }
has_sync_standby() { [ -n "$(member_with_role sync_standby)" ]; }

up() {
    if [ -f "$HA_DIR/ports.env" ] && [ -n "$(ha_pids)" ]; then
        load_ports
        if healthy; then
            say "the cluster in $HA_DIR is up already"
            echo "DATABASE_URL=$(database_url)"
            return 0
        fi
        say "stopping what an earlier run left in $HA_DIR"
    fi
    stop_all
    remove_dir
    install_missing
    PG_BIN="$(pg_bin_dir)" || die "no Postgres binaries under /usr/lib/postgresql"

    mkdir -p "$HA_DIR"
    touch "$HA_DIR/$MARKER"
    local ports
    read -r -a ports <<<"$(free_ports 9)"
    ETCD_CLIENT_PORT="${ports[0]}"; ETCD_PEER_PORT="${ports[1]}"; HAPROXY_PORT="${ports[2]}"
    PG=("${ports[3]}" "${ports[4]}" "${ports[5]}")
    REST=("${ports[6]}" "${ports[7]}" "${ports[8]}")
    REST_PORTS="${REST[*]}"
    cat >"$HA_DIR/ports.env" <<EOF
ETCD_CLIENT_PORT=$ETCD_CLIENT_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
HAPROXY_PORT=$HAPROXY_PORT
PG_PORTS="${PG[*]}"
REST_PORTS="${REST[*]}"
EOF
    for i in 0 1 2; do
        mkdir -p "$HA_DIR/${NODES[$i]}"
        write_patroni_config "$i"
    done
    write_haproxy_config
    if [ "$(id -u)" -eq 0 ]; then chown -R postgres:postgres "$HA_DIR"; fi
    as_owner test -w "$HA_DIR" || die "the postgres user cannot write $HA_DIR (its parents must let it through)"
    chmod 700 "$HA_DIR"/node[0-9]

    say "starting etcd on 127.0.0.1:$ETCD_CLIENT_PORT"
    launch etcd etcd --name seckill-ha --data-dir "$HA_DIR/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
        --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster "seckill-ha=http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster-state new
    wait_until 30 "etcd answering" etcd_answers

    say "starting Patroni nodes (Postgres on ${PG[*]}, REST on ${REST[*]})"
    for name in "${NODES[@]}"; do
        launch "$name" patroni "$HA_DIR/$name.yml"
    done
    say "starting haproxy on 127.0.0.1:$HAPROXY_PORT"
    launch haproxy haproxy -db -f "$HA_DIR/haproxy.cfg"

    wait_until 90 "a leader" has_leader
    wait_until 120 "a synchronous standby" has_sync_standby
    wait_until 30 "haproxy leading to the primary" haproxy_leads_to_primary
    # The database DATABASE_URL names (the service would create it too).
    psql -X -q -h 127.0.0.1 -p "$HAPROXY_PORT" -U postgres -d postgres \
        -c "CREATE DATABASE seckill" >/dev/null 2>&1 || true
    members >&2
    echo "DATABASE_URL=$(database_url)"
}

down() {
    stop_all
    remove_dir
    say "stopped; $HA_DIR removed"
}

status() {
    load_ports
    as_owner patronictl -c "$HA_DIR/node0.yml" list "$SCOPE"
}

kill_primary() {
    load_ports
    local leader pid
    leader="$(member_with_role leader)"
    [ -n "$leader" ] || die "no running leader to kill"
    pid="$(head -n1 "$HA_DIR/$leader/data/postmaster.pid" 2>/dev/null)" || die "no postmaster.pid for $leader"
    kill -KILL "$pid"
    say "sent SIGKILL to $leader's postmaster (pid $pid)"
}

switchover() {
    load_ports
    local leader standby
    leader="$(member_with_role leader)"
    standby="$(member_with_role sync_standby)"
    [ -n "$leader" ] && [ -n "$standby" ] || die "switchover needs a leader and a synchronous standby: $(members | tr '\n' ';')"
    say "switching over from $leader to $standby"
    as_owner patronictl -c "$HA_DIR/node0.yml" switchover --leader "$leader" --candidate "$standby" --force "$SCOPE"
}

# Stops the given nodes: SIGTERM to their Patroni (which, on the
# synchronous standby, first waits for the leader to release it, then stops
# its Postgres), then SIGKILL to whatever outlives 20 s.
stop_nodes() {
    local pids
    pids="$(nodes_pids "$@" | awk '$3 ~ /(^|\/)patroni$/ { print $1 }')"
    [ -n "$pids" ] && kill -TERM $pids 2>/dev/null || true
    for _ in $(seq 1 100); do
        [ -z "$(nodes_pids "$@")" ] && break
        sleep 0.2
    done
    pids="$(nodes_pids "$@" | awk '{ print $1 }')"
    if [ -n "$pids" ]; then
        say "killing what did not stop: $pids"
        kill -KILL $pids 2>/dev/null || true
        sleep 0.2
    fi
}

# The standbys go one after the other, as an operator takes them down: the
# asynchronous ones first, then the synchronous one, whose Patroni asks the
# leader to drop it from synchronous_standby_names before its Postgres stops
# (nobody is left to take its place, so the leader names none). Stopped all
# at once, the leader could name the other standby in the moment it too was
# stopping, and its commits waited for a standby gone. The leader goes on
# alone: with synchronous_mode_strict false it commits without a standby.
stop_replicas() {
    load_ports
    local leader sync node others=()
    leader="$(member_with_role leader)"
    [ -n "$leader" ] || die "no running leader to leave running: $(members | tr '\n' ';')"
    sync="$(member_with_role sync_standby)"
    for node in "${NODES[@]}"; do
        [ "$node" = "$leader" ] || [ "$node" = "$sync" ] || others+=("$node")
    done
    [ "${#others[@]}" -gt 0 ] && stop_nodes "${others[@]}"
    [ -n "$sync" ] && stop_nodes "$sync"
    say "stopped ${others[*]} ${sync:+then $sync (the synchronous standby)}; $leader runs alone"
}

case "${1:-}" in
    install) install_missing ;;
    up) up ;;
    down) down ;;
    status) status ;;
    kill-primary) kill_primary ;;
    switchover) switchover ;;
    stop-replicas) stop_replicas ;;
    logs) print_logs ;;
    *) die "usage: scripts/ha.sh install|up|down|status|kill-primary|switchover|stop-replicas|logs (HA_DIR, default target/ha)" ;;
esac
