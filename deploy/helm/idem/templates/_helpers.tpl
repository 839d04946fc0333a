{{/* Names and labels. */}}
{{- define "idem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "idem.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "idem.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "idem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The selector of one workload: the proxy's or the app's. */}}
{{- define "idem.selector" -}}
app.kubernetes.io/name: {{ include "idem.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "idem.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The workload the Service sends to: the proxy, or the app whose sidecar it is. */}}
{{- define "idem.serviceComponent" -}}
{{- if .Values.proxy.enabled }}proxy{{ else }}app{{ end }}
{{- end }}

{{- define "idem.hasService" -}}
{{- if or .Values.proxy.enabled (and .Values.app.enabled .Values.app.proxySidecar) }}true{{ end }}
{{- end }}

{{/*
Checks of the values that a schema cannot express; each failure says
what to set.
*/}}
{{- define "idem.validate" -}}
{{- $types := list "embedded" "redis" "redis-cluster" "redis-sentinel" "postgres" }}
{{- if not (has .Values.store.type $types) }}
{{- fail (printf "store.type %q: want one of %s" .Values.store.type (join ", " $types)) }}
{{- end }}
{{- if and (ne .Values.store.type "embedded") (not .Values.store.existingSecret) }}
{{- fail (printf "store.existingSecret: name the Secret that holds the %s connection (keys in store.secretKeys)" .Values.store.type) }}
{{- end }}
{{- if and (eq .Values.store.type "redis-sentinel") (not .Values.store.sentinel.addresses) }}
{{- fail "store.sentinel.addresses: list the Sentinels (host:port each) for store.type redis-sentinel" }}
{{- end }}
{{- if and .Values.proxy.enabled .Values.app.enabled }}
{{- fail "proxy.enabled and app.enabled: choose one per release (the proxy in front of an API elsewhere, or idem beside your container)" }}
{{- end }}
{{- if not (or .Values.proxy.enabled .Values.app.enabled) }}
{{- fail "nothing to deploy: set proxy.enabled or app.enabled" }}
{{- end }}
{{- if and .Values.proxy.enabled (not .Values.proxy.upstream) }}
{{- fail "proxy.upstream: the URL of the API behind the proxy, e.g. http://payments.default.svc.cluster.local:8080" }}
{{- end }}
{{- if and .Values.app.enabled (not .Values.app.image) }}
{{- fail "app.image: your container's image (repository:tag)" }}
{{- end }}
{{- if and .Values.app.enabled (not (or .Values.app.proxySidecar .Values.app.consume.enabled)) }}
{{- fail "app.enabled: set app.proxySidecar or app.consume.enabled, or idem has nothing to do in the pod" }}
{{- end }}
{{- if and .Values.app.enabled .Values.app.consume.enabled (not .Values.app.consume.from) }}
{{- fail "app.consume.from: the broker URL idem consume reads (--from)" }}
{{- end }}
{{- if and .Values.app.enabled .Values.app.consume.enabled (eq .Values.store.type "embedded") }}
{{- fail "app.consume with store.type embedded: idem consume refuses the embedded store when more than one sidecar could read the same messages; use redis, redis-cluster, redis-sentinel or postgres" }}
{{- end }}
{{- if eq .Values.store.type "embedded" }}
{{- $replicas := ternary .Values.proxy.replicaCount .Values.app.replicaCount .Values.proxy.enabled | int }}
{{- if gt $replicas 1 }}
{{- fail (printf "store.type embedded with %d replicas: each pod would keep records of its own, and a retry reaching another pod would run again; use 1 replica or a shared store" $replicas) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The store's environment variables, the same for idem proxy and idem consume. */}}
{{- define "idem.storeEnv" -}}
{{- $s := .Values.store }}
{{- if eq $s.type "embedded" }}
- name: IDEM_DATA
  value: /data
{{- else if eq $s.type "redis" }}
- name: IDEM_REDIS
  valueFrom:
    secretKeyRef: {name: {{ $s.existingSecret | quote }}, key: {{ $s.secretKeys.url | quote }}}
{{- else if eq $s.type "redis-cluster" }}
- name: IDEM_REDIS_CLUSTER
  valueFrom:
    secretKeyRef: {name: {{ $s.existingSecret | quote }}, key: {{ $s.secretKeys.url | quote }}}
{{- else if eq $s.type "redis-sentinel" }}
- name: IDEM_REDIS_SENTINEL
  value: {{ printf "%s@%s" $s.sentinel.masterName (join "," $s.sentinel.addresses) | quote }}
- name: IDEM_REDIS_SENTINEL_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ $s.existingSecret | quote }}, key: {{ $s.secretKeys.sentinelPassword | quote }}, optional: true}
{{- else if eq $s.type "postgres" }}
- name: IDEM_POSTGRES
  valueFrom:
    secretKeyRef: {name: {{ $s.existingSecret | quote }}, key: {{ $s.secretKeys.url | quote }}}
{{- end }}
{{- if or (eq $s.type "redis-cluster") (eq $s.type "redis-sentinel") }}
- name: IDEM_REDIS_USERNAME
  valueFrom:
    secretKeyRef: {name: {{ $s.existingSecret | quote }}, key: {{ $s.secretKeys.username | quote }}, optional: true}
- name: IDEM_REDIS_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ $s.existingSecret | quote }}, key: {{ $s.secretKeys.password | quote }}, optional: true}
{{- end }}
{{- if hasPrefix "redis" $s.type }}
- name: IDEM_REDIS_PREFIX
  value: {{ $s.redisPrefix | quote }}
{{- end }}
{{- end }}

{{/* The container of idem proxy; .upstream is the URL it forwards to. */}}
{{- define "idem.proxyContainer" -}}
{{- $v := .root.Values }}
- name: idem-proxy
  image: {{ include "idem.image" .root | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  args:
    - proxy
    {{- with $v.proxy.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  env:
    - name: IDEM_UPSTREAM
      value: {{ .upstream | quote }}
    - name: IDEM_LISTEN
      value: {{ printf "0.0.0.0:%d" (int $v.ports.http) | quote }}
    - name: IDEM_ADMIN_LISTEN
      value: {{ printf "0.0.0.0:%d" (int $v.ports.admin) | quote }}
    - name: IDEM_LOG_FORMAT
      value: json
    {{- include "idem.storeEnv" .root | trim | nindent 4 }}
    {{- with $v.proxy.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: http
      containerPort: {{ $v.ports.http }}
      protocol: TCP
    - name: admin
      containerPort: {{ $v.ports.admin }}
      protocol: TCP
  livenessProbe:
    httpGet: {path: /healthz, port: admin}
    {{- toYaml $v.probes.liveness | nindent 4 }}
  readinessProbe:
    httpGet: {path: /readyz, port: admin}
    {{- toYaml $v.probes.readiness | nindent 4 }}
  {{- if $v.preStopSleepSeconds }}
  lifecycle:
    preStop:
      sleep:
        seconds: {{ $v.preStopSleepSeconds }}
  {{- end }}
  resources:
    {{- toYaml $v.proxy.resources | nindent 4 }}
  securityContext:
    {{- toYaml $v.securityContext | nindent 4 }}
  volumeMounts:
    - name: data
      mountPath: /data
{{- end }}

{{/* The container of idem consume, beside the app. */}}
{{- define "idem.consumeContainer" -}}
{{- $v := .Values }}
{{- $c := $v.app.consume }}
- name: idem-consume
  image: {{ include "idem.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  args:
    - consume
    - --from
    - {{ $c.from | quote }}
    - --to
    - {{ $c.to | default (printf "http://127.0.0.1:%d/messages" (int $v.app.port)) | quote }}
    {{- with $c.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  env:
    - name: IDEM_ADMIN_LISTEN
      value: {{ printf "0.0.0.0:%d" (int $c.adminPort) | quote }}
    - name: IDEM_LOG_FORMAT
      value: json
    {{- include "idem.storeEnv" . | trim | nindent 4 }}
    {{- with $c.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: consume-admin
      containerPort: {{ $c.adminPort }}
      protocol: TCP
  livenessProbe:
  {{- if $c.livenessProbe }}
    {{- toYaml $c.livenessProbe | nindent 4 }}
  {{- else }}
    httpGet: {path: /healthz, port: consume-admin}
    {{- toYaml $v.probes.liveness | nindent 4 }}
  {{- end }}
  readinessProbe:
  {{- if $c.readinessProbe }}
    {{- toYaml $c.readinessProbe | nindent 4 }}
  {{- else }}
    httpGet: {path: /readyz, port: consume-admin}
    {{- toYaml $v.probes.readiness | nindent 4 }}
  {{- end }}
  resources:
    {{- toYaml $c.resources | nindent 4 }}
  securityContext:
    {{- toYaml $v.securityContext | nindent 4 }}
  volumeMounts:
    - name: data
      mountPath: /data
{{- end }}

{{/* The /data volume: the embedded store's, an emptyDir otherwise. */}}
{{- define "idem.dataVolume" -}}
- name: data
{{- if and (eq .Values.store.type "embedded") .Values.store.persistence.enabled }}
  persistentVolumeClaim:
    claimName: {{ .Values.store.persistence.existingClaim | default (printf "%s-data" (include "idem.fullname" .)) }}
{{- else }}
  emptyDir: {}
{{- end }}
{{- end }}
