{{/* Names: the release name, or release-chart when it does not contain the chart name. */}}
{{- define "storaged.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "storaged.headless" -}}
{{- printf "%s-headless" (include "storaged.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "storaged.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: message-store
{{- end -}}

{{- define "storaged.labels" -}}
{{ include "storaged.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "storaged.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Seconds from SIGTERM to the end of storaged's drain: preStop sleep + shutdown timeout. */}}
{{- define "storaged.drainSeconds" -}}
{{- $d := .Values.shutdownTimeout | toString -}}
{{- if not (regexMatch "^[0-9]+s$" $d) -}}
{{- fail (printf "shutdownTimeout %q: write it in whole seconds, such as 40s" $d) -}}
{{- end -}}
{{- add (int .Values.preStopSleepSeconds) (int (trimSuffix "s" $d)) -}}
{{- end -}}

{{/* 1=pod-0.headless.ns.svc:port,2=pod-1...: the replication peers (issue 13's --raft-peers). */}}
{{- define "storaged.raftPeers" -}}
{{- $peers := list -}}
{{- range $i := until (int .Values.replicas) -}}
{{- $peers = append $peers (printf "%d=%s-%d.%s.%s.svc:%d" (add $i 1) (include "storaged.fullname" $) $i (include "storaged.headless" $) $.Release.Namespace (int $.Values.replication.peerPort)) -}}
{{- end -}}
{{- join "," $peers -}}
{{- end -}}
