{{/* Chart name, overridable. */}}
{{- define "kubetune.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name prefix of every resource: <release>-kubetune, or the release name when it contains the chart name. */}}
{{- define "kubetune.fullname" -}}
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

{{- define "kubetune.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "kubetune.labels" -}}
helm.sh/chart: {{ include "kubetune.chart" . }}
app.kubernetes.io/name: {{ include "kubetune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kubetune
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: call with (dict "ctx" $ "component" "operator"). */}}
{{- define "kubetune.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubetune.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Labels of one component: call with (dict "ctx" $ "component" "operator"). */}}
{{- define "kubetune.componentLabels" -}}
{{ include "kubetune.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "kubetune.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kubetune.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* image reference from {repository, tag, digest}: call with (dict "image" .Values.x.image "default" .Chart.AppVersion). */}}
{{- define "kubetune.image" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .default .image.tag) }}
{{- end }}
{{- end }}

{{- define "kubetune.operatorImage" -}}
{{- include "kubetune.image" (dict "image" .Values.operator.image "default" .Chart.AppVersion) }}
{{- end }}

{{- define "kubetune.trainerImage" -}}
{{- include "kubetune.image" (dict "image" .Values.trainer.image "default" .Chart.AppVersion) }}
{{- end }}

{{- define "kubetune.mlflowImage" -}}
{{- include "kubetune.image" (dict "image" .Values.mlflow.server.image "default" "") }}
{{- end }}

{{- define "kubetune.mlflowName" -}}
{{- printf "%s-mlflow" (include "kubetune.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kubetune.mlflowClaim" -}}
{{- default (include "kubetune.mlflowName" .) .Values.mlflow.server.persistence.existingClaim }}
{{- end }}

{{/* The tracking URI the operator hands to jobs that set none. */}}
{{- define "kubetune.trackingUri" -}}
{{- if .Values.mlflow.trackingUri }}
{{- .Values.mlflow.trackingUri }}
{{- else if .Values.mlflow.server.enabled }}
{{- printf "http://%s.%s.svc:%d" (include "kubetune.mlflowName" .) .Release.Namespace (int .Values.mlflow.server.port) }}
{{- end }}
{{- end }}

{{/* Whether the operator creates a per-job trainer identity (needs RBAC on ServiceAccounts, Roles, RoleBindings). */}}
{{- define "kubetune.perJobTrainerIdentity" -}}
{{- if not .Values.trainer.serviceAccount.name }}true{{- end }}
{{- end }}

{{/* Restricted Pod Security Standard, container level. */}}
{{- define "kubetune.containerSecurityContext" -}}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- /*
The operator's leader election values, as JSON (fromJson): a release upgraded with --reuse-values from
before leader election has none: on, with the defaults.
*/ -}}
{{- define "kubetune.leaderElection" -}}
{{- $given := .Values.operator.leaderElection | default dict }}
{{- $out := dict "enabled" true "leaseDurationSeconds" 15 "renewDeadlineSeconds" 10 "retryPeriodSeconds" 2 }}
{{- range $key, $value := $given }}
{{- $_ := set $out $key $value }}
{{- end }}
{{- $out | toJson }}
{{- end }}

{{- /* operator.replicas: 2 for a release from before it (--reuse-values) */ -}}
{{- define "kubetune.operatorReplicas" -}}
{{- if kindIs "invalid" .Values.operator.replicas }}2{{ else }}{{ .Values.operator.replicas }}{{ end }}
{{- end }}
