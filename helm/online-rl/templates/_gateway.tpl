{{/* The gateway, in one of its roles (online_rl/config.py, gateway.role):
- all: the single gateway (gateway.split.enabled false): routes and runs the rollout, its state on a volume;
- proxy: routes by the rollout state on the bus and relays /rollout to the controller; no MLflow, no state;
- controller: routes as a proxy and runs the rollout while it holds the Lease <fullname>-rollout-controller;
  MLflow's gateway user, the model for the off-policy gate, a ServiceAccount that may hold the Lease.
docs/deploy.md, Scaling the gateway. */}}

{{- define "orl.gatewayController" -}}{{ include "orl.fullname" . }}-gateway-controller{{- end -}}
{{- define "orl.leaseName" -}}{{ include "orl.fullname" . }}-rollout-controller{{- end -}}

{{/* The controllers' ServiceAccount: the chart's own, or an existing one when gateway.split.rbac.create
is false (it must be allowed the Lease as the chart's Role allows it). */}}
{{- define "orl.controllerServiceAccount" -}}
{{- if .Values.gateway.split.rbac.create -}}
{{- include "orl.gatewayController" . -}}
{{- else -}}
{{- required "gateway.split.serviceAccountName is required when gateway.split.rbac.create is false: name a ServiceAccount allowed to create, get and update the controller's Lease (coordination.k8s.io leases), or set gateway.split.rbac.create=true" .Values.gateway.split.serviceAccountName -}}
{{- end -}}
{{- end -}}

{{/* The pod template of one role: (dict "ctx" $ "role" "all") */}}
{{- define "orl.gatewayPod" -}}
{{- $ := .ctx -}}
{{- $role := .role -}}
{{- $runs := ne $role "proxy" -}}{{/* runs the rollout: MLflow, and the model for the off-policy gate */}}
{{- $gate := dig "gateway" "rollout" "offpolicy_gate" false $.Values.config -}}
{{- $component := ternary "gateway-controller" "gateway" (eq $role "controller") -}}
metadata:
  labels:
    {{- include "orl.componentLabels" (dict "ctx" $ "component" $component) | nindent 4 }}
  annotations:
    {{- include "orl.checksums" $ | nindent 4 }}
    {{- include "orl.upstreamChecksum" $ | nindent 4 }}
    {{- if $runs }}
    {{- include "orl.mlflowAuthChecksum" $ | nindent 4 }}
    {{- end }}
spec:
  {{- if eq $role "controller" }}
  {{- include "orl.podSecurityAs" (dict "ctx" $ "serviceAccount" (include "orl.controllerServiceAccount" $)) | nindent 2 }}
  # The Lease is read and written through the API server with the pod's token (the chart's other pods
  # get none).
  automountServiceAccountToken: true
  # The leader and its standby on different nodes, where there are several.
  affinity:
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm:
            topologyKey: kubernetes.io/hostname
            labelSelector:
              matchLabels:
                {{- include "orl.selector" (dict "ctx" $ "component" $component) | nindent 16 }}
  {{- else }}
  {{- include "orl.podSecurity" $ | nindent 2 }}
  {{- end }}
  containers:
    - name: gateway
      image: {{ include "orl.image" $ }}
      imagePullPolicy: {{ $.Values.image.pullPolicy }}
      args: ["serve", "gateway"]
      env:
        {{- include "orl.env" $ | nindent 8 }}
        - name: ORL_GATEWAY__UPSTREAM_API_KEY
          valueFrom:
            secretKeyRef:
              name: {{ include "orl.fullname" $ }}-upstream-key
              key: key
        {{- if ne $role "all" }}
        - name: ORL_GATEWAY__ROLE
          value: {{ $role }}
        # Where /rollout is relayed: pinned to the controller Service, whatever a record on the bus says
        - name: ORL_GATEWAY__CONTROLLER_URL
          value: http://{{ include "orl.gatewayController" $ }}.{{ $.Release.Namespace }}.svc:{{ include "orl.gatewayPort" $ }}
        {{- end }}
        {{- if eq $role "controller" }}
        - name: ORL_GATEWAY__ELECTION
          value: kubernetes
        - name: ORL_GATEWAY__LEASE_NAME
          value: {{ include "orl.leaseName" $ }}
        # Where the proxies relay /rollout: the controller Service, whose only ready pod is the leader
        - name: ORL_GATEWAY__ADVERTISE_URL
          value: http://{{ include "orl.gatewayController" $ }}.{{ $.Release.Namespace }}.svc:{{ include "orl.gatewayPort" $ }}
        {{- end }}
        {{- include "orl.kafkaEnv" (dict "ctx" $ "component" "gateway") | nindent 8 }}
        {{- if $runs }}
        # MLflow's user of the rollout controller: it moves champion and challenger, tags versions
        {{- include "orl.mlflowUserEnv" (dict "ctx" $ "component" "gateway") | nindent 8 }}
        {{- end }}
      ports:
        - name: http
          containerPort: {{ include "orl.gatewayPort" $ }}
          protocol: TCP
      startupProbe:
        httpGet: {path: /healthz, port: http}
        periodSeconds: 5
        failureThreshold: 60
      livenessProbe:
        httpGet: {path: /healthz, port: http}
        periodSeconds: 10
        failureThreshold: 6
      {{- if eq $role "controller" }}
      # 200 from the leader only: a standby answers 503 "standby" (alive, but not in the Service)
      {{- end }}
      readinessProbe:
        httpGet: {path: /readyz, port: http}
        periodSeconds: 5
      resources:
        {{- toYaml $.Values.gateway.resources | nindent 8 }}
      securityContext:
        {{- toYaml $.Values.securityContext | nindent 8 }}
      volumeMounts:
        {{- include "orl.configMounts" (dict "ctx" $ "model" (and $runs $gate)) | nindent 8 }}
        {{- include "orl.keysMount" $ | nindent 8 }}
        {{- include "orl.kafkaMount" $ | nindent 8 }}
        {{- if $runs }}
        - name: state
          mountPath: {{ include "orl.statePath" $ }}
        {{- end }}
        - name: tmp
          mountPath: /tmp
  volumes:
    {{- include "orl.configVolume" $ | nindent 4 }}
    {{- include "orl.keysVolume" $ | nindent 4 }}
    {{- include "orl.kafkaVolume" $ | nindent 4 }}
    {{- if and $runs $gate }}{{/* the gate scores with the model */}}
    {{- with $.Values.modelVolume }}
    - name: model
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- end }}
    {{- if eq $role "all" }}
    - name: state
      persistentVolumeClaim:
        claimName: {{ printf "%s-gateway-state" (include "orl.fullname" $) }}
    {{- else if eq $role "controller" }}
    # The local copy of the state and audit log; the durable ones are on the bus (<prefix>.rollout)
    - name: state
      emptyDir: {}
    {{- end }}
    - name: tmp
      emptyDir: {}
  {{- with $.Values.gateway.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $.Values.gateway.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
