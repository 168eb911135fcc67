#!/usr/bin/env bash
# Three Apache Kafka (KRaft) nodes on 127.0.0.1, each broker and controller, for fault tests: topics
# are replicated 3 times with min.insync.replicas 2 (one node may die, nothing acknowledged is lost).
#
#   deploy/local/kafka/cluster.sh start|stop|status|bootstrap|reset
#   deploy/local/kafka/cluster.sh kill N       SIGKILL node N (1-3), as a lost machine would die
#   deploy/local/kafka/cluster.sh restart N [N...]   start nodes again on their data (after kill; all
#                                               of them at once when the whole quorum was lost)
#
# The jars are kafka.sh's (fetched once from Maven Central). Environment:
#   ORL_KAFKA_CLUSTER_PORT  first client port (default 29092): nodes listen on it, +1, +2; their
#                           controllers on +100, +101, +102
#   ORL_KAFKA_HOME          state folder shared with kafka.sh (default ~/.cache/online-rl/kafka)
#   ORL_KAFKA_CLUSTER_RUN   the cluster's folder (default $ORL_KAFKA_HOME/cluster-<port>)
#   ORL_KAFKA_HEAP          JVM heap per node (default 384m)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
base=${ORL_KAFKA_CLUSTER_PORT:-29092}
home=${ORL_KAFKA_HOME:-${ORL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/online-rl}/kafka}
libs=$home/libs
run=${ORL_KAFKA_CLUSTER_RUN:-$home/cluster-$base}
timeout=${ORL_KAFKA_START_TIMEOUT:-120}
nodes=(1 2 3)

die() { echo "cluster.sh: $*" >&2; exit 1; }
info() { echo "cluster.sh: $*" >&2; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
client_port() { echo $((base + $1 - 1)); }
controller_port() { echo $((base + 99 + $1)); }
bootstrap() { echo "127.0.0.1:$(client_port 1),127.0.0.1:$(client_port 2),127.0.0.1:$(client_port 3)"; }

node_pid() {
  local file=$run/node-$1/pid pid
  [ -f "$file" ] || return 1
  pid=$(cat "$file")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q "kafka.Kafka" "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

java_cmd=(java -Xmx"${ORL_KAFKA_HEAP:-384m}" -Xms128m -XX:+UseG1GC -XX:TieredStopAtLevel=1
  -Dlog4j2.configurationFile="$here/log4j2.properties" -cp "$libs/*")

write_config() {
  local n=$1 dir=$run/node-$1 voters=""
  for m in "${nodes[@]}"; do voters="${voters:+$voters,}$m@127.0.0.1:$(controller_port "$m")"; done
  mkdir -p "$dir/data"
  cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=CLIENT://127.0.0.1:$(client_port "$n"),CONTROLLER://127.0.0.1:$(controller_port "$n")
advertised.listeners=CLIENT://127.0.0.1:$(client_port "$n")
listener.security.protocol.map=CONTROLLER:PLAINTEXT,CLIENT:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=CLIENT
log.dirs=$dir/data
num.partitions=1
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
auto.create.topics.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
group.initial.rebalance.delay.ms=0
PROPS
}

launch() {  # start node $1 on its (formatted) data
  local n=$1 dir=$run/node-$1
  if pid=$(node_pid "$n"); then info "node $n already running (pid $pid)"; return 0; fi
  for p in "$(client_port "$n")" "$(controller_port "$n")"; do
    port_open "$p" && die "port $p on 127.0.0.1 is taken by another process; choose ORL_KAFKA_CLUSTER_PORT"
  done
  nohup "${java_cmd[@]}" kafka.Kafka "$dir/server.properties" >>"$dir/broker.log" 2>&1 </dev/null &
  echo $! > "$dir/pid"
}

wait_ready() {  # until node $1 has started and listens
  local n=$1 dir=$run/node-$1 deadline=$((SECONDS + timeout))
  while [ $SECONDS -lt $deadline ]; do
    # (right after the launch the process may not have exec'd java yet: only a gone pid is a failure)
    kill -0 "$(cat "$dir/pid")" 2>/dev/null || { tail -n 20 "$dir/broker.log" >&2; die "node $n exited during start-up; see $dir/broker.log"; }
    if port_open "$(client_port "$n")" && [ "$(grep -c "Kafka Server started" "$dir/broker.log")" -ge "$(cat "$dir/starts")" ]; then
      return 0
    fi
    sleep 0.5
  done
  die "node $n did not start within ${timeout}s; see $dir/broker.log"
}

start() {
  command -v java >/dev/null 2>&1 || die "Java 17 or newer is needed (Debian: apt-get install openjdk-17-jre-headless)"
  bash "$here/kafka.sh" fetch
  local cid=""
  [ -f "$run/cluster.id" ] && cid=$(cat "$run/cluster.id")
  if [ -z "$cid" ]; then
    mkdir -p "$run"
    cid=$("${java_cmd[@]}" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n1)
    echo "$cid" > "$run/cluster.id"
  fi
  for n in "${nodes[@]}"; do
    write_config "$n"
    if [ ! -f "$run/node-$n/data/meta.properties" ]; then
      "${java_cmd[@]}" kafka.tools.StorageTool format -t "$cid" -c "$run/node-$n/server.properties" \
        >>"$run/node-$n/broker.log" 2>&1 || die "formatting node $n failed; see $run/node-$n/broker.log"
    fi
  done
  for n in "${nodes[@]}"; do
    node_pid "$n" >/dev/null && continue
    echo $(( $(grep -c "Kafka Server started" "$run/node-$n/broker.log" 2>/dev/null || true) + 1 )) > "$run/node-$n/starts"
    launch "$n"
  done
  for n in "${nodes[@]}"; do wait_ready "$n"; done
  info "three nodes ready"
  bootstrap
}

kill_node() {
  local pid
  pid=$(node_pid "$1") || die "node $1 is not running"
  kill -KILL "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  info "node $1 killed (SIGKILL)"
}

restart_nodes() {  # all launched before any is waited for: a lone node of a dead quorum cannot start
  local n
  for n in "$@"; do
    echo $(( $(grep -c "Kafka Server started" "$run/node-$n/broker.log" 2>/dev/null || true) + 1 )) > "$run/node-$n/starts"
    launch "$n"
  done
  for n in "$@"; do
    wait_ready "$n"
    info "node $n back"
  done
}

stop() {
  for n in "${nodes[@]}"; do
    if pid=$(node_pid "$n"); then kill -TERM "$pid"; fi
  done
  for n in "${nodes[@]}"; do
    if pid=$(node_pid "$n"); then
      for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$run/node-$n/pid"
  done
  info "cluster stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) for n in "${nodes[@]}"; do
            if pid=$(node_pid "$n"); then echo "node $n: running on 127.0.0.1:$(client_port "$n") (pid $pid)"
            else echo "node $n: stopped"; fi
          done ;;
  bootstrap) bootstrap ;;
  kill) [[ "${2:-}" =~ ^[123]$ ]] || die "kill N: N is 1, 2 or 3"; kill_node "$2" ;;
  restart) shift; [ $# -ge 1 ] || die "restart N [N...]: N is 1, 2 or 3"
    for n in "$@"; do [[ "$n" =~ ^[123]$ ]] || die "restart N [N...]: N is 1, 2 or 3 (got $n)"; done
    restart_nodes "$@" ;;
  reset) stop; rm -rf "$run"; info "removed $run" ;;
  *) echo "usage: $0 start|stop|status|bootstrap|kill N|restart N|reset" >&2; exit 2 ;;
esac
