#!/usr/bin/env bash
# A real single-node Apache Kafka (KRaft) broker on 127.0.0.1 for development and tests.
#
#   deploy/local/kafka/kafka.sh start|stop|status|fetch|bootstrap
#
# Jars come from Maven Central (pom.xml beside this script, `mvn dependency:copy-dependencies`)
# and are cached. Environment:
#   ORL_KAFKA_PORT        broker port (default 9092); the controller listens on ORL_KAFKA_CONTROLLER_PORT
#                         (default: broker port + 1)
#   ORL_KAFKA_HOME        state folder: jars, config, data, log, pid (default $ORL_CACHE_DIR/kafka,
#                         that is ~/.cache/online-rl/kafka)
#   ORL_KAFKA_RUN         this broker's folder: config, data, log, pid (default $ORL_KAFKA_HOME/run-<port>;
#                         `online-rl up` puts it in its run folder so a fresh run starts with empty topics)
#   ORL_KAFKA_HEAP        JVM heap (default 512m)
#   ORL_KAFKA_START_TIMEOUT  seconds to wait for the broker to answer (default 90)
#   ORL_KAFKA_SCRAM_USERS "name:password[,name:password...]": the client listener asks for SASL
#                         SCRAM-SHA-512 and these users exist (they are added when the storage is formatted,
#                         so set them before the first start of a broker folder)
#   ORL_KAFKA_TLS_DIR     a folder holding server.pem (the broker's private key, then its certificate chain;
#                         the certificate must name 127.0.0.1) and ca.pem: the client listener speaks TLS
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
port=${ORL_KAFKA_PORT:-9092}
cport=${ORL_KAFKA_CONTROLLER_PORT:-$((port + 1))}
home=${ORL_KAFKA_HOME:-${ORL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/online-rl}/kafka}
libs=$home/libs
run=${ORL_KAFKA_RUN:-$home/run-$port}
data=$run/data
pidfile=$run/broker.pid
logfile=$run/broker.log
props=$run/server.properties
timeout=${ORL_KAFKA_START_TIMEOUT:-90}

die() { echo "kafka.sh: $*" >&2; exit 1; }
info() { echo "kafka.sh: $*" >&2; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

running_pid() {
  [ -f "$pidfile" ] || return 1
  local pid
  pid=$(cat "$pidfile")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q "kafka.Kafka" "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

need_java() {
  command -v java >/dev/null 2>&1 || die "Java 17 or newer is needed for the local Kafka broker and none was found on PATH; install it (Debian: apt-get install openjdk-17-jre-headless) or point ORL_KAFKA__BOOTSTRAP_SERVERS at an existing broker"
  local v
  v=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
  [ -n "$v" ] && [ "$v" -ge 17 ] || die "Java $v found; Kafka 4 needs Java 17 or newer (set JAVA_HOME/PATH to a newer JDK)"
}

fetch() {
  local stamp=$libs/.pom.sha256 want
  want=$(sha256sum "$here/pom.xml" | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && ls "$libs"/kafka_2.13-*.jar >/dev/null 2>&1; then
    return 0
  fi
  command -v mvn >/dev/null 2>&1 || die "Maven (mvn) is needed once to fetch the Kafka jars from Maven Central; install it (Debian: apt-get install maven)"
  info "fetching Kafka jars from Maven Central into $libs"
  mkdir -p "$home" || die "cannot create $home; set ORL_KAFKA_HOME to a writable folder"
  local tmp=$libs.tmp.$$
  rm -rf "$tmp"
  mvn -q -B -f "$here/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$tmp" >&2 || { rm -rf "$tmp"; die "mvn could not fetch the Kafka jars (see above)"; }
  rm -rf "$libs" && mv "$tmp" "$libs" && echo "$want" > "$stamp"
}

scram_users=${ORL_KAFKA_SCRAM_USERS:-}
tls_dir=${ORL_KAFKA_TLS_DIR:-}

# The client listener's protocol: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
protocol() {
  local p=PLAINTEXT
  [ -n "$scram_users" ] && p=SASL_PLAINTEXT
  if [ -n "$tls_dir" ]; then
    [ "$p" = SASL_PLAINTEXT ] && p=SASL_SSL || p=SSL
  fi
  echo "$p"
}

# With SCRAM the broker talks to itself as its own user, whose password is made once per folder.
broker_password() {
  local file=$run/broker.password
  if [ ! -f "$file" ]; then
    (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$file")
  fi
  cat "$file"
}

check_security() {
  if [ -n "$tls_dir" ]; then
    [ -f "$tls_dir/server.pem" ] && [ -f "$tls_dir/ca.pem" ] \
      || die "ORL_KAFKA_TLS_DIR=$tls_dir must hold server.pem (key, then certificate chain) and ca.pem"
  fi
  local entry
  IFS=',' read -ra entries <<< "$scram_users"
  for entry in "${entries[@]}"; do
    case "$entry" in
      ?*:?*) ;;
      *) die "ORL_KAFKA_SCRAM_USERS entry '${entry%%:*}' is not name:password" ;;
    esac
  done
}

security_config() {
  local proto
  proto=$(protocol)
  echo "listener.security.protocol.map=CONTROLLER:PLAINTEXT,CLIENT:$proto"
  if [ -n "$scram_users" ]; then
    echo "sasl.enabled.mechanisms=SCRAM-SHA-512"
    echo "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512"
    echo "listener.name.client.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"orl-broker\" password=\"$(broker_password)\";"
  fi
  if [ -n "$tls_dir" ]; then
    echo "ssl.keystore.type=PEM"
    echo "ssl.keystore.location=$tls_dir/server.pem"
    echo "ssl.truststore.type=PEM"
    echo "ssl.truststore.location=$tls_dir/ca.pem"
  fi
}

# --add-scram arguments for the formatter: the broker's own user and ORL_KAFKA_SCRAM_USERS.
scram_args() {
  [ -n "$scram_users" ] || return 0
  echo "--add-scram"
  echo "SCRAM-SHA-512=[name=orl-broker,password=$(broker_password)]"
  local entry
  IFS=',' read -ra entries <<< "$scram_users"
  for entry in "${entries[@]}"; do
    echo "--add-scram"
    echo "SCRAM-SHA-512=[name=${entry%%:*},password=${entry#*:}]"
  done
}

write_config() {
  mkdir -p "$data"
  cat > "$props" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=CLIENT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=CLIENT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=CLIENT
$(security_config)
log.dirs=$data
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.hours=168
PROPS
}

java_cmd=(java -Xmx"${ORL_KAFKA_HEAP:-512m}" -Xms128m -XX:+UseG1GC
  -Dlog4j2.configurationFile="$here/log4j2.properties" -cp "$libs/*")

start() {
  if pid=$(running_pid); then
    info "broker already running on 127.0.0.1:$port (pid $pid)"
    echo "127.0.0.1:$port"
    return 0
  fi
  need_java
  for p in "$port" "$cport"; do
    if port_open "$p"; then
      die "port $p on 127.0.0.1 is already taken by another process; stop it or choose other ports with ORL_KAFKA_PORT (and ORL_KAFKA_CONTROLLER_PORT)"
    fi
  done
  fetch
  check_security
  write_config
  if [ ! -f "$data/meta.properties" ]; then
    local cid
    cid=$("${java_cmd[@]}" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n1)
    local scram=()
    mapfile -t scram < <(scram_args)
    "${java_cmd[@]}" kafka.tools.StorageTool format -t "$cid" -c "$props" "${scram[@]}" >>"$logfile" 2>&1 \
      || die "formatting KRaft storage in $data failed; see $logfile"
  fi
  info "starting broker on 127.0.0.1:$port (log: $logfile)"
  nohup "${java_cmd[@]}" kafka.Kafka "$props" >>"$logfile" 2>&1 </dev/null &
  local started=$!
  echo "$started" > "$pidfile"
  local deadline=$((SECONDS + timeout))
  while [ $SECONDS -lt $deadline ]; do
    # alive, not running_pid: until nohup has exec'd java, the process's command line is still bash's
    if ! kill -0 "$started" 2>/dev/null; then
      tail -n 20 "$logfile" >&2
      die "the broker exited during start-up; see $logfile"
    fi
    if port_open "$port" && grep -q "Kafka Server started" "$logfile"; then
      info "broker ready on 127.0.0.1:$port"
      echo "127.0.0.1:$port"
      return 0
    fi
    sleep 0.5
  done
  stop >/dev/null 2>&1 || true
  die "the broker did not answer on 127.0.0.1:$port within ${timeout}s; see $logfile"
}

stop() {
  local pid
  if ! pid=$(running_pid); then
    info "no broker running for port $port"
    rm -f "$pidfile"
    return 0
  fi
  kill -TERM "$pid"
  for _ in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; info "broker stopped"; return 0; }
    sleep 0.5
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$pidfile"
  info "broker did not stop within 30s and was killed"
}

status() {
  if pid=$(running_pid) && port_open "$port"; then
    echo "running on 127.0.0.1:$port (pid $pid)"
  else
    echo "stopped"
    return 3
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  fetch) fetch ;;
  reset) stop; rm -rf "$run"; info "removed $run" ;;
  bootstrap) echo "127.0.0.1:$port" ;;
  *) echo "usage: $0 start|stop|status|fetch|reset|bootstrap" >&2; exit 2 ;;
esac
