{{/* Kafka: the contract's topics, how each component's client reaches the cluster (Strimzi: the TLS
listener with a SCRAM user of its own; external: what kafka.external says) and what each component may
do there (its KafkaUser's ACLs, kafka-users.yaml). */}}

{{/* The partition count of the keyed topics (config.bus.partitions; the settings' default is 4). */}}
{{- define "orl.partitions" -}}
{{- dig "bus" "partitions" 4 .Values.config | int -}}
{{- end -}}

{{/* The contract's topics and the internal ones of the joiner and the gateway (online_rl/bus/topics.py:
<prefix>.<name>), as a JSON list; `about` says what the KafkaTopic holds; `retentionMs`, where set, replaces
kafka.strimzi.retentionMs. Every component creates them all at start (ensure_topics), so they are here in
every mode. */}}
{{- define "orl.kafkaTopics" -}}
{{- $partitions := include "orl.partitions" . | int -}}
{{- $contract := "A contract topic (docs/event-log.md)." -}}
{{- list
  (dict "name" "interactions" "partitions" $partitions "compact" false "about" $contract)
  (dict "name" "feedback" "partitions" $partitions "compact" false "about" $contract)
  (dict "name" "samples" "partitions" $partitions "compact" false "about" $contract)
  (dict "name" "dlq" "partitions" 1 "compact" false "about" $contract)
  (dict "name" "join-state" "partitions" $partitions "compact" true
    "about" "The joiner's compacted changelog (its window state).")
  (dict "name" "join-pairs" "partitions" $partitions "compact" false
    "about" "The joiner's internal topic: preferences on their way to the joiner task of their other request.")
  (dict "name" "rollout" "partitions" 1 "compact" true
    "about" "The gateway's compacted rollout topic: the rollout state, the controller's heartbeat, the audit log.")
  (dict "name" "gateway-health" "partitions" 1 "compact" false "retentionMs" 3600000
    "about" "The gateway proxies' answer health for the controller's guardrails (read live: an hour is kept).")
  | toJson -}}
{{- end -}}

{{/* A topic's name: (dict "ctx" $ "name" "samples") */}}
{{- define "orl.topic" -}}
{{- printf "%s.%s" (dig "bus" "topic_prefix" "orl" .ctx.Values.config) .name -}}
{{- end -}}

{{/* The components that talk to Kafka (the trainer: its head, where the driver runs), as a JSON list. */}}
{{- define "orl.kafkaComponents" -}}
{{- $all := list "feedback" "inference" "gateway" "joiner" -}}
{{- if .Values.trainer.enabled }}{{ $all = append $all "trainer" }}{{ end -}}
{{- toJson $all -}}
{{- end -}}

{{/* A component's KafkaUser, its SCRAM username and the Secret Strimzi's User Operator makes for it:
(dict "ctx" $ "component" "joiner") */}}
{{- define "orl.kafkaUser" -}}
{{- printf "%s-%s" (include "orl.fullname" .ctx) .component -}}
{{- end -}}

{{/* The joiner's consumer group (config.join.group_id; unset, <topic prefix>-joiner, as the code names it:
online_rl/config.py), and the prefix of its replicas' transactional ids (online_rl/cli/bus.py). */}}
{{- define "orl.joinerGroup" -}}
{{- dig "join" "group_id" (printf "%s-joiner" (dig "bus" "topic_prefix" "orl" .Values.config)) .Values.config -}}
{{- end -}}
{{- define "orl.joinerTransactionalPrefix" -}}{{ include "orl.joinerGroup" . }}-{{- end -}}

{{/* What each component does on Kafka, as the code does it: the topics it reads and writes, its consumer
groups (literal names and prefixes; `describeGroups`: only looked up) and transactional ids (literal names
and prefixes). */}}
{{- define "orl.kafkaUses" -}}
{{- $t := dict -}}
{{- range $topic := include "orl.kafkaTopics" . | fromJsonArray -}}
{{- $_ := set $t $topic.name (include "orl.topic" (dict "ctx" $ "name" $topic.name)) -}}
{{- end -}}
# services/feedback (service.py -> online_rl/ingest/writer.py)
feedback:
  writes: [{{ $t.feedback | quote }}]
# services/inference (online_rl/serving/interaction_log.py)
inference:
  writes: [{{ $t.interactions | quote }}]
{{- if .Values.gateway.split.enabled }}
# the gateway's proxies and controllers, one user (services/gateway/main.py): every one tails the rollout
# topic (online_rl/rollout/shared.py: a throw-away orl-rollout-* group, sized with end_offsets' probe) and
# reports answer health; the leading controller tallies samples (online_rl/rollout/driver/canary.py), reads
# the health reports, writes the state, heartbeat and audit, and reloads them with Bus.read_all
gateway:
  reads: [{{ $t.samples | quote }}, {{ $t.rollout | quote }}, {{ index $t "gateway-health" | quote }}]
  writes: [{{ $t.rollout | quote }}, {{ index $t "gateway-health" | quote }}]
  groupPrefixes: [orl-rollout-, read-all-]
  describeGroups: [orl-probe]
{{- else }}
# the single gateway's rollout controller (online_rl/rollout/driver/canary.py) tallies samples in a
# throw-away group each start; its state is on its volume
gateway:
  reads: [{{ $t.samples | quote }}]
  groupPrefixes: [orl-rollout-]
{{- end }}
# online_rl/stream/joiner.py: every replica is a member of one group; one transaction writes samples, the
# changelog, join-pairs, dead letters and offsets, under the replica's own transactional id
# (<its group>-<join.instance>: the pod's name); it restores the changelog with Bus.read_all (a throw-away
# group) and sizes it with end_offsets' probe
joiner:
  reads: [{{ $t.interactions | quote }}, {{ $t.feedback | quote }}, {{ index $t "join-state" | quote }}, {{ index $t "join-pairs" | quote }}]
  writes: [{{ $t.samples | quote }}, {{ index $t "join-state" | quote }}, {{ index $t "join-pairs" | quote }}, {{ $t.dlq | quote }}]
  groups: [{{ include "orl.joinerGroup" . }}]
  groupPrefixes: [read-all-]
  describeGroups: [orl-probe]
  transactionalIdPrefixes: [{{ include "orl.joinerTransactionalPrefix" . }}]
# online_rl/trainer/controller.py: reads samples in config.trainer.group_id (unset, <topic prefix>-trainer),
# dead-letters what it rejects
trainer:
  reads: [{{ $t.samples | quote }}]
  writes: [{{ $t.dlq | quote }}]
  groups: [{{ dig "trainer" "group_id" (printf "%s-trainer" (dig "bus" "topic_prefix" "orl" .Values.config)) .Values.config | quote }}]
  describeGroups: [orl-probe]
{{- end -}}

{{/* How clients reach the cluster, checked once, as JSON: protocol, SASL mechanism, the Secret with
`username` and `password` (external mode; Strimzi's are per component), and the Secret whose `ca.crt`
the clients trust (empty: the system's CAs). */}}
{{- define "orl.kafkaClient" -}}
{{- if eq .Values.kafka.mode "strimzi" -}}
{{- dict "protocol" "SASL_SSL" "mechanism" "SCRAM-SHA-512" "secret" ""
    "caSecret" (printf "%s-cluster-ca-cert" (include "orl.kafkaCluster" .)) | toJson -}}
{{- else -}}
{{- $e := .Values.kafka.external -}}
{{- $protocol := $e.securityProtocol | default "PLAINTEXT" -}}
{{- $sasl := hasPrefix "SASL_" $protocol -}}
{{- $tls := hasSuffix "SSL" $protocol -}}
{{- $ca := $e.caFromSecret | default false -}}
{{- if and $sasl (not $e.saslMechanism) -}}
{{- fail (printf "kafka.external.saslMechanism is required with kafka.external.securityProtocol=%s: set it to what the brokers' listener speaks (SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN)" $protocol) -}}
{{- end -}}
{{- if and $e.saslMechanism (not $sasl) -}}
{{- fail (printf "kafka.external.saslMechanism=%s needs SASL but kafka.external.securityProtocol is %s: set securityProtocol to SASL_SSL (or SASL_PLAINTEXT), or remove saslMechanism" $e.saslMechanism $protocol) -}}
{{- end -}}
{{- if and $ca (not $tls) -}}
{{- fail (printf "kafka.external.caFromSecret needs TLS but kafka.external.securityProtocol is %s: set securityProtocol to SSL or SASL_SSL, or caFromSecret to false" $protocol) -}}
{{- end -}}
{{- if and $sasl (not $e.credentialsSecret) -}}
{{- fail (printf "kafka.external.credentialsSecret is required with kafka.external.securityProtocol=%s: create a Secret with the keys username and password (and ca.crt, with caFromSecret) and name it there" $protocol) -}}
{{- end -}}
{{- if and $ca (not $e.credentialsSecret) -}}
{{- fail "kafka.external.credentialsSecret is required with kafka.external.caFromSecret: create a Secret whose key ca.crt is the CA that signed the brokers' certificates and name it there" -}}
{{- end -}}
{{- if and $e.credentialsSecret (not (or $sasl $ca)) -}}
{{- fail (printf "kafka.external.credentialsSecret is set but kafka.external.securityProtocol=%s reads nothing from it: set securityProtocol to SASL_SSL (its username and password) or caFromSecret to true (its ca.crt), or remove credentialsSecret" $protocol) -}}
{{- end -}}
{{- dict "protocol" $protocol "mechanism" (ternary $e.saslMechanism "" $sasl) "secret" (ternary $e.credentialsSecret "" $sasl)
    "caSecret" (ternary $e.credentialsSecret "" $ca) | toJson -}}
{{- end -}}
{{- end -}}

{{- define "orl.kafkaCaPath" -}}/etc/online-rl/kafka-ca{{- end -}}

{{/* The Kafka settings of a component's container: (dict "ctx" $ "component" "joiner") */}}
{{- define "orl.kafkaEnv" -}}
{{- $k := include "orl.kafkaClient" .ctx | fromJson -}}
- name: ORL_KAFKA__SECURITY_PROTOCOL
  value: {{ $k.protocol }}
{{- if $k.mechanism }}
- name: ORL_KAFKA__SASL_MECHANISM
  value: {{ $k.mechanism }}
{{- if $k.secret }}
- name: ORL_KAFKA__SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $k.secret }}
      key: username
- name: ORL_KAFKA__SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $k.secret }}
      key: password
{{- else }}
{{- $user := include "orl.kafkaUser" . }}
- name: ORL_KAFKA__SASL_USERNAME
  value: {{ $user }}
- name: ORL_KAFKA__SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $user }}
      key: password
{{- end }}
{{- end }}
{{- if $k.caSecret }}
- name: ORL_KAFKA__SSL_CA_LOCATION
  value: {{ include "orl.kafkaCaPath" .ctx }}/ca.crt
{{- end }}
{{- end -}}

{{- define "orl.kafkaMount" -}}
{{- if (include "orl.kafkaClient" . | fromJson).caSecret }}
- name: kafka-ca
  mountPath: {{ include "orl.kafkaCaPath" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "orl.kafkaVolume" -}}
{{- $k := include "orl.kafkaClient" . | fromJson -}}
{{- if $k.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ $k.caSecret }}
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- end -}}
