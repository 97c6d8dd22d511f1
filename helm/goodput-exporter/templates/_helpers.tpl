{{/* Names and labels. */}}
{{- define "goodput-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "goodput-exporter.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "goodput-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "goodput-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "goodput-exporter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "goodput-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/component: exporter
app.kubernetes.io/part-of: goodput-exporter
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "goodput-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "goodput-exporter.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "goodput-exporter.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* The pod-labels feature: kubelet source on and label names given. */}}
{{- define "goodput-exporter.podLabels" -}}
{{- if and .Values.kubelet.enabled .Values.kubelet.podLabels -}}true{{- end -}}
{{- end -}}

{{/* DCGM's engine inside the exporter: root and CAP_SYS_ADMIN for the profiling fields. */}}
{{- define "goodput-exporter.dcgmEmbedded" -}}
{{- if and .Values.dcgm.enabled (eq .Values.dcgm.mode "bindings") (eq .Values.dcgm.hostengine "embedded") -}}true{{- end -}}
{{- end -}}

{{/* Root is needed to connect to the kubelet's socket, to create the ingest socket in the root-owned hostPath
directory, and for the embedded DCGM engine's profiling fields. */}}
{{- define "goodput-exporter.needsRoot" -}}
{{- if or .Values.kubelet.enabled .Values.ingest.enabled (include "goodput-exporter.dcgmEmbedded" .) -}}true{{- end -}}
{{- end -}}

{{/* The container's securityContext: the values' one, plus the user chosen from the features and the
capabilities the enabled features need. */}}
{{- define "goodput-exporter.securityContext" -}}
{{- $sc := deepCopy .Values.securityContext -}}
{{- if not (hasKey $sc "runAsUser") -}}
{{- if include "goodput-exporter.needsRoot" . -}}
{{- $_ := set $sc "runAsUser" 0 -}}
{{- $_ := set $sc "runAsGroup" 0 -}}
{{- $_ := set $sc "runAsNonRoot" false -}}
{{- else -}}
{{- $_ := set $sc "runAsUser" 65532 -}}
{{- $_ := set $sc "runAsGroup" 65532 -}}
{{- $_ := set $sc "runAsNonRoot" true -}}
{{- end -}}
{{- end -}}
{{- $add := list -}}
{{- if .Values.sysPtrace -}}{{- $add = append $add "SYS_PTRACE" -}}{{- end -}}
{{- if include "goodput-exporter.dcgmEmbedded" . -}}{{- $add = append $add "SYS_ADMIN" -}}{{- end -}}
{{- if $add -}}
{{- $caps := deepCopy (default dict $sc.capabilities) -}}
{{- $_ := set $caps "add" (concat (default list $caps.add) $add | uniq) -}}
{{- $_ := set $sc "capabilities" $caps -}}
{{- end -}}
{{- toYaml $sc -}}
{{- end -}}

{{/* Labels for the Prometheus Operator monitors. The operator gives every target namespace, pod and container
labels, the exporter pod's own; goodput_gpu_pod_info carries labels of those names for the pod holding each GPU,
which Prometheus would rename exported_namespace, exported_pod and exported_container, breaking the rules'
joins. The exporter pod's are kept as exporter_namespace and exporter_pod instead. With nodeLabel, the node's
name is `instance` (one exporter per node; the rules name a node by instance) and `node`. */}}
{{- define "goodput-exporter.relabelings" -}}
- action: replace
  sourceLabels: [namespace]
  targetLabel: exporter_namespace
- action: replace
  sourceLabels: [pod]
  targetLabel: exporter_pod
- action: labeldrop
  regex: namespace|pod|container
{{- if .monitor.nodeLabel }}
- action: replace
  sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: instance
- action: replace
  sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node
{{- end }}
{{- with .monitor.relabelings }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* node-problem-detector: the Service that reaches the exporter pod of the caller's own node (internalTrafficPolicy
Local), and the daemon URL the health check reads: nodeProblemDetector.config.daemon_url, else that Service's. */}}
{{- define "goodput-exporter.nodeLocalService" -}}
{{- printf "%s-node-local" (include "goodput-exporter.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "goodput-exporter.healthDaemonUrl" -}}
{{- $config := .Values.nodeProblemDetector.config | default dict -}}
{{- if $config.daemon_url -}}
{{- $config.daemon_url -}}
{{- else -}}
{{- printf "http://%s.%s.svc:%d" (include "goodput-exporter.nodeLocalService" .) .Release.Namespace (int .Values.port) -}}
{{- end -}}
{{- end -}}
