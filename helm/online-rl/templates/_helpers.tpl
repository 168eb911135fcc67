{{/* Names, labels, images and the wiring every component shares. */}}

{{- define "orl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "orl.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains (include "orl.name" .) .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "orl.name" .) | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "orl.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "orl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "gateway") */}}
{{- define "orl.selector" -}}
app.kubernetes.io/name: {{ include "orl.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "orl.componentLabels" -}}
{{ include "orl.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "orl.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "orl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "orl.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "orl.gpuImage" -}}
{{- printf "%s:%s" .Values.image.repository (default (printf "%s-gpu" .Chart.AppVersion) .Values.image.gpuTag) -}}
{{- end -}}

{{/* Where things are inside the pods (the image's layout, deploy/docker/). */}}
{{- define "orl.configPath" -}}/etc/online-rl/config/config.yaml{{- end -}}
{{- define "orl.keysPath" -}}/etc/online-rl/keys/api-keys{{- end -}}
{{- define "orl.statePath" -}}/var/lib/online-rl/state{{- end -}}

{{- define "orl.keysSecret" -}}
{{- default (printf "%s-api-keys" (include "orl.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{/* The version-signing key's Secret: signing.pem (the trainer's private key) and signing.pub (the
public keys serving trusts). Required: serving loads nothing unsigned. */}}
{{- define "orl.signingSecret" -}}
{{- if not .Values.signing.existingSecret -}}
{{- fail (printf "signing.existingSecret is empty: the trainer signs every model version and the inference pods load only versions signed by its key. Make the key with `online-rl keys signing signing.pem` (it prints \"public: <key>\"), store it with `kubectl -n %s create secret generic online-rl-signing --from-file=signing.pem --from-literal=signing.pub=<key>` and set signing.existingSecret=online-rl-signing (docs/deploy.md)" .Release.Namespace) -}}
{{- end -}}
{{- .Values.signing.existingSecret -}}
{{- end -}}
{{- define "orl.signingPath" -}}/etc/online-rl/signing{{- end -}}

{{- define "orl.kafkaCluster" -}}{{ include "orl.fullname" . }}-kafka{{- end -}}

{{- define "orl.bootstrap" -}}
{{- if eq .Values.kafka.mode "external" -}}
{{- required "kafka.external.bootstrapServers is required with kafka.mode=external (host:port[,host:port])" .Values.kafka.external.bootstrapServers -}}
{{- else -}}
{{- printf "%s-kafka-bootstrap:9093" (include "orl.kafkaCluster" .) -}}{{/* the TLS listener (kafka.yaml) */}}
{{- end -}}
{{- end -}}

{{- define "orl.mlflowUri" -}}
{{- if eq .Values.mlflow.mode "external" -}}
{{- required "mlflow.external.trackingUri is required with mlflow.mode=external (e.g. http://mlflow.ml.svc:5000)" .Values.mlflow.external.trackingUri -}}
{{- else -}}
{{- printf "http://%s-mlflow:5000" (include "orl.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "orl.port" -}}
{{- $section := index .ctx.Values.config .section | default dict -}}
{{- index $section "port" | default .default | int -}}
{{- end -}}
{{- define "orl.inferencePort" -}}{{ include "orl.port" (dict "ctx" . "section" "inference" "default" 8081) }}{{- end -}}
{{- define "orl.feedbackPort" -}}{{ include "orl.port" (dict "ctx" . "section" "feedback_api" "default" 8082) }}{{- end -}}
{{- define "orl.gatewayPort" -}}{{ include "orl.port" (dict "ctx" . "section" "gateway" "default" 8080) }}{{- end -}}

{{/* The settings every component reads: the user's tree with the chart's wiring laid over it. */}}
{{- define "orl.config" -}}
{{- $c := deepCopy (.Values.config | default dict) -}}
{{- $kafkaHint := "; Kafka's security comes from kafka.mode (strimzi: TLS and a SCRAM user per component) or kafka.external.securityProtocol, saslMechanism, credentialsSecret and caFromSecret" -}}
{{- $signingHint := "; name the signing key's Secret in signing.existingSecret instead" -}}
{{- $splitHint := "; gateway.split.enabled runs the gateway as proxies and leader-elected controllers (docs/deploy.md, Scaling the gateway)" -}}
{{- $instead := dict "kafka.security_protocol" $kafkaHint "kafka.sasl_mechanism" $kafkaHint "kafka.sasl_username" $kafkaHint
  "kafka.sasl_password" $kafkaHint "kafka.ssl_ca_location" $kafkaHint
  "mlflow.signing_key_file" $signingHint "mlflow.trusted_signers" $signingHint
  "gateway.role" $splitHint "gateway.election" $splitHint "gateway.lease_name" $splitHint
  "gateway.advertise_url" $splitHint "gateway.lock_file" $splitHint "gateway.controller_url" $splitHint -}}
{{- range $path := concat (list "kafka.bootstrap_servers") (keys $instead | sortAlpha) (list "mlflow.tracking_uri" "mlflow.artifact_root" "ray.address" "gateway.replicas" "gateway.upstream_api_key" "gateway.api_keys_file" "inference.api_keys_file" "feedback_api.api_keys_file" "trainer.checkpoint_dir" "gateway.rollout.state_dir" "inference.adapters_dir" "cache_dir" "inference.host" "gateway.host" "feedback_api.host" "bus.embedded_path") -}}
{{- $parts := splitList "." $path -}}
{{- $node := $c -}}
{{- range $i, $p := $parts -}}
{{- if and (kindIs "map" $node) (hasKey $node $p) -}}
{{- if eq (add1 $i) (len $parts) -}}
{{- fail (printf "config.%s is set by the chart (it wires the components together); remove it from your values (see docs/deploy.md)%s" $path (get $instead $path)) -}}
{{- end -}}
{{- $node = index $node $p -}}
{{- else -}}
{{- $node = "" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $state := include "orl.statePath" . -}}
{{- $keys := include "orl.keysPath" . -}}
{{- $wiring := dict
  "kafka" (dict "bootstrap_servers" (include "orl.bootstrap" .))
  "mlflow" (dict "tracking_uri" (include "orl.mlflowUri" .))
  "ray" (dict "address" "auto")
  "inference" (dict "host" "0.0.0.0" "api_keys_file" $keys "adapters_dir" "/tmp/online-rl/adapters")
  "feedback_api" (dict "host" "0.0.0.0" "api_keys_file" $keys)
  "gateway" (dict "host" "0.0.0.0" "api_keys_file" $keys
      "replicas" (list (printf "dns+http://%s-inference-pods:%s" (include "orl.fullname" .) (include "orl.inferencePort" .)))
      "rollout" (dict "state_dir" (printf "%s/rollout" $state)))
  "trainer" (dict "checkpoint_dir" (printf "%s/checkpoints" $state))
-}}
{{- $trainer := index $c "trainer" | default dict -}}
{{- if not (hasKey $trainer "cpus_per_worker") -}}
{{- $requested := dig "workers" "resources" "requests" "cpu" "1" .Values.trainer -}}
{{- $cpu := toString (dig "workers" "resources" "limits" "cpu" $requested .Values.trainer) -}}{{/* KubeRay gives Ray the limit first */}}
{{- $cores := ternary (divf (trimSuffix "m" $cpu | float64) 1000.0) ($cpu | float64) (hasSuffix "m" $cpu) -}}
{{- $_ := set $wiring.trainer "cpus_per_worker" (maxf 1.0 $cores) -}}
{{- end -}}
{{- toYaml (mustMergeOverwrite $c $wiring) -}}
{{- end -}}

{{/* Pod-level pieces every online-rl container shares. */}}
{{- define "orl.podSecurity" -}}
{{ include "orl.podSecurityAs" (dict "ctx" . "serviceAccount" (include "orl.serviceAccount" .)) }}
{{- end -}}

{{/* The same, under another ServiceAccount: (dict "ctx" $ "serviceAccount" "name") */}}
{{- define "orl.podSecurityAs" -}}
securityContext:
  {{- toYaml .ctx.Values.podSecurityContext | nindent 2 }}
serviceAccountName: {{ .serviceAccount }}
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "orl.env" -}}
- name: ORL_CONFIG
  value: {{ include "orl.configPath" . }}
- name: ORL_LOG_FORMAT
  value: json
- name: PYTHONUNBUFFERED
  value: "1"
{{- end -}}

{{- define "orl.configVolume" -}}
- name: config
  configMap:
    name: {{ include "orl.fullname" . }}-config
{{- end -}}

{{- define "orl.keysVolume" -}}
- name: api-keys
  secret:
    secretName: {{ include "orl.keysSecret" . }}
    items:
      - key: api-keys
        path: api-keys
{{- end -}}

{{/* The settings, and the model volume where the model is read: (dict "ctx" $ "model" bool) */}}
{{- define "orl.configMounts" -}}
{{ include "orl.configMount" .ctx }}
{{- if and .model .ctx.Values.modelVolume }}
- name: model
  mountPath: /models
  readOnly: true
{{- end }}
{{- end -}}

{{- define "orl.configMount" -}}
- name: config
  mountPath: /etc/online-rl/config
  readOnly: true
{{- end -}}

{{- define "orl.keysMount" -}}
- name: api-keys
  mountPath: /etc/online-rl/keys
  readOnly: true
{{- end -}}

{{/* The gateway's key to the inference pods: the given one, else the Secret's (kept across
upgrades), else a new one. Computed once per render, so the Secret and the checksums agree. */}}
{{- define "orl.upstreamKey" -}}
{{- if not .Values.auth.upstreamKey -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (printf "%s-upstream-key" (include "orl.fullname" .)) -}}
{{- $key := printf "orl_%s" (randAlphaNum 43) -}}
{{- if and $existing $existing.data (hasKey $existing.data "key") -}}
{{- $key = index $existing.data "key" | b64dec -}}
{{- end -}}
{{- $_ := set .Values.auth "upstreamKey" $key -}}
{{- end -}}
{{- .Values.auth.upstreamKey -}}
{{- end -}}

{{- define "orl.upstreamChecksum" -}}
checksum/upstream: {{ printf "checksum:%s" (include "orl.upstreamKey" .) | sha256sum }}
{{- end -}}

{{/* Restart pods when what they read changes. */}}
{{- define "orl.checksums" -}}
checksum/config: {{ include "orl.config" . | sha256sum }}
checksum/keys: {{ printf "%s%s" (toJson .Values.auth.apiKeys) .Values.auth.existingSecret | sha256sum }}
{{- end -}}

{{/* MLflow's sign-in (its basic-auth app; who may do what: online_rl/registry/access.py). Each component
that talks to MLflow is a user of its own: the trainer registers versions, the gateway moves the aliases,
the inference pods only read. The Secret's keys: admin-password and flask-secret-key (the server's), and
<component>-username and <component>-password for each of `orl.mlflowUsers`. */}}
{{- define "orl.mlflowUsers" -}}trainer gateway inference{{- end -}}

{{/* The Secret with MLflow's passwords: the given one, else (internal mode) the chart's; empty: an external
server whose users the chart is not told, so the components sign in as nobody. */}}
{{- define "orl.mlflowAuthSecret" -}}
{{- if .Values.mlflow.auth.existingSecret -}}
{{- .Values.mlflow.auth.existingSecret -}}
{{- else if eq .Values.mlflow.mode "internal" -}}
{{- printf "%s-mlflow-auth" (include "orl.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The chart's MLflow passwords, as JSON: the Secret's (kept across upgrades), else new ones. Computed once
per render, so the Secret and the checksums agree. */}}
{{- define "orl.mlflowAuth" -}}
{{- if not .Values.mlflow.auth.generated -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (printf "%s-mlflow-auth" (include "orl.fullname" .)) -}}
{{- $old := (and $existing $existing.data) | default dict -}}
{{- $out := dict -}}
{{- $keys := list "admin-password" "flask-secret-key" -}}
{{- range $user := splitList " " (include "orl.mlflowUsers" .) }}{{ $keys = append $keys (printf "%s-password" $user) }}{{ end -}}
{{- range $key := $keys -}}
{{- $_ := set $out $key (ternary (index $old $key | default "" | b64dec) (randAlphaNum 40) (hasKey $old $key)) -}}
{{- end -}}
{{- range $user := splitList " " (include "orl.mlflowUsers" .) }}{{ $_ := set $out (printf "%s-username" $user) $user }}{{ end -}}
{{- $_ := set .Values.mlflow.auth "generated" $out -}}
{{- end -}}
{{- toJson .Values.mlflow.auth.generated -}}
{{- end -}}

{{- define "orl.mlflowAuthChecksum" -}}
{{- if include "orl.mlflowAuthSecret" . -}}
checksum/mlflow-auth: {{ ternary .Values.mlflow.auth.existingSecret (include "orl.mlflowAuth" .) (ne .Values.mlflow.auth.existingSecret "") | sha256sum }}
{{- end -}}
{{- end -}}

{{/* A component's MLflow user (MLflow's clients read it from the environment): (dict "ctx" $ "component"
"trainer"). Nothing when the chart knows no users (an external server without mlflow.auth.existingSecret). */}}
{{- define "orl.mlflowUserEnv" -}}
{{- $secret := include "orl.mlflowAuthSecret" .ctx -}}
{{- if $secret }}
- name: MLFLOW_TRACKING_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .component }}-username
- name: MLFLOW_TRACKING_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .component }}-password
{{- end }}
{{- end -}}
