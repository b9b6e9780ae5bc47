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

{{/* replication.bootstrapReplicas, checked: how many members the group was bootstrapped with. */}}
{{- define "storaged.bootstrapReplicas" -}}
{{- $b := toString .Values.replication.bootstrapReplicas -}}
{{- if or (not (regexMatch "^[0-9]+$" $b)) (lt (int $b) 3) -}}
{{- fail (printf "replication.enabled needs replication.bootstrapReplicas (%s): the replicas the group was first installed with, at least 3 (on a first install: replicas); never change it afterwards" $b) -}}
{{- end -}}
{{- int $b -}}
{{- end -}}

{{/* 1=pod-0.headless.ns.svc:port,2=pod-1...: the bootstrap members (--raft-peers). Every pod gets this same
list for the life of the group: a bootstrap member's data dir records it, and a pod beyond it joins. */}}
{{- define "storaged.raftPeers" -}}
{{- $peers := list -}}
{{- range $i := until (include "storaged.bootstrapReplicas" . | int) -}}
{{- $peers = append $peers (printf "%d=%s" (add $i 1) (include "storaged.peerAddr" (dict "root" $ "ordinal" $i))) -}}
{{- end -}}
{{- join "," $peers -}}
{{- end -}}

{{/* The peer address of pod ordinal: pod-N.headless.ns.svc:port (dict "root" . "ordinal" N). */}}
{{- define "storaged.peerAddr" -}}
{{- $r := .root -}}
{{- printf "%s-%d.%s.%s.svc:%d" (include "storaged.fullname" $r) (int .ordinal) (include "storaged.headless" $r) $r.Release.Namespace (int $r.Values.replication.peerPort) -}}
{{- end -}}

{{/* The member id of pod ordinal (dict "root" . "ordinal" N): replication.memberIds, else N + 1. */}}
{{- define "storaged.memberId" -}}
{{- $m := .root.Values.replication.memberIds | default dict -}}
{{- $k := toString .ordinal -}}
{{- if hasKey $m $k -}}
{{- $id := get $m $k -}}
{{- if kindIs "float64" $id -}}
{{- toString (int64 $id) -}}
{{- else -}}
{{- toString $id -}}
{{- end -}}
{{- else -}}
{{- add (int .ordinal) 1 -}}
{{- end -}}
{{- end -}}

{{/* replication.memberIds as --raft-ordinal-ids (ordinal=id,...), checked: ordinals and ids are integers, an
id given to a pod is a new member's (not a bootstrap member's), and no two pods share an id. */}}
{{- define "storaged.ordinalIds" -}}
{{- $boot := include "storaged.bootstrapReplicas" . | int -}}
{{- $pairs := list -}}
{{- range $o, $id := .Values.replication.memberIds | default dict -}}
{{- $ids := toString $id -}}
{{- if and (kindIs "float64" $id) (eq (float64 (int64 $id)) $id) -}}
{{- /* a number from a values file (1000000 would print as 1e+06) */ -}}
{{- $ids = toString (int64 $id) -}}
{{- end -}}
{{- if not (regexMatch "^(0|[1-9][0-9]*)$" $o) -}}
{{- fail (printf "replication.memberIds %q: want a pod ordinal (0, 1, ...) as the key" $o) -}}
{{- end -}}
{{- if not (regexMatch "^[1-9][0-9]*$" $ids) -}}
{{- fail (printf "replication.memberIds %s: %s: want a positive member id" $o $ids) -}}
{{- end -}}
{{- if le (int $ids) $boot -}}
{{- fail (printf "replication.memberIds %s: %s is a bootstrap member's id (1-%d): a pod given a new id is a new member, with an id the group never used" $o $ids $boot) -}}
{{- end -}}
{{- $pairs = append $pairs (printf "%s=%s" $o $ids) -}}
{{- end -}}
{{- $owner := dict -}}
{{- range $i := until (int .Values.replicas) -}}
{{- $id := include "storaged.memberId" (dict "root" $ "ordinal" $i) -}}
{{- if hasKey $owner $id -}}
{{- fail (printf "pods %s and %s-%d would both be member %s: give one of them a new id in replication.memberIds" (get $owner $id) (include "storaged.fullname" $) $i $id) -}}
{{- end -}}
{{- $_ := set $owner $id (printf "%s-%d" (include "storaged.fullname" $) $i) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/* replication.join.clusterId, checked: needed once a pod joins (replicas above bootstrapReplicas, or
memberIds). */}}
{{- define "storaged.joinClusterId" -}}
{{- /* dig: values reused from a release of an older chart (helm upgrade --reuse-values) have no join */ -}}
{{- $cid := toString (dig "join" "clusterId" "" .Values.replication) -}}
{{- $boot := include "storaged.bootstrapReplicas" . | int -}}
{{- if and $cid (not (regexMatch "^[0-9a-f]{32}$" $cid)) -}}
{{- fail (printf "replication.join.clusterId %q: want the group's cluster id, 32 lower-case hex digits (cluster_id in the output of storaged replica members)" $cid) -}}
{{- end -}}
{{- if and (not $cid) (gt (int .Values.replicas) $boot) -}}
{{- fail (printf "replicas %d > replication.bootstrapReplicas %d: the pods beyond the bootstrap members join the running group and need replication.join.clusterId (cluster_id in the output of storaged replica members)" (int .Values.replicas) $boot) -}}
{{- end -}}
{{- if and (not $cid) .Values.replication.memberIds -}}
{{- fail "replication.memberIds: a pod given a new id joins the running group and needs replication.join.clusterId (cluster_id in the output of storaged replica members)" -}}
{{- end -}}
{{- $cid -}}
{{- end -}}
