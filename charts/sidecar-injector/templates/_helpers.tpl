{{/* The chart name. */}}
{{- define "sidecar-injector.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of every object. Kept to 52 characters so that the derived names
(<fullname>-tls, <fullname>-leader) stay valid.
*/}}
{{- define "sidecar-injector.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret holding the CA and the serving certificate (written by the operator). */}}
{{- define "sidecar-injector.secretName" -}}
{{- printf "%s-tls" (include "sidecar-injector.fullname" .) }}
{{- end }}

{{/* The leader-election Lease (written by the operator). */}}
{{- define "sidecar-injector.leaseName" -}}
{{- printf "%s-leader" (include "sidecar-injector.fullname" .) }}
{{- end }}

{{/*
The names of the operator's MutatingAdmissionPolicies and their bindings, as a JSON list: the
policy, its proof, and the bindings of up to 8 namespace groups (NAMESPACE_BINDING_SLOTS in
crates/core/src/policy.rs; e2e/tests/chart.rs holds the two together).
*/}}
{{- define "sidecar-injector.mutatingPolicyNames" -}}
{{- $fullname := include "sidecar-injector.fullname" . -}}
{{- $names := list $fullname (printf "%s-proof" $fullname) -}}
{{- range $slot := until 8 }}
{{- $names = append $names (printf "%s-namespaces-%d" $fullname $slot) -}}
{{- end }}
{{- $names | toJson }}
{{- end }}

{{/*
The names of the operator's ValidatingAdmissionPolicies and their bindings, as a JSON list: the
guard, the warnings policy (and its bindings per namespace group, as the
MutatingAdmissionPolicy's) and the after-admission policy.
*/}}
{{- define "sidecar-injector.validatingPolicyNames" -}}
{{- $fullname := include "sidecar-injector.fullname" . -}}
{{- $names := list (printf "%s-guard" $fullname) (printf "%s-warnings" $fullname) (printf "%s-after-admission" $fullname) -}}
{{- range $slot := until 8 }}
{{- $names = append $names (printf "%s-warnings-namespaces-%d" $fullname $slot) -}}
{{- end }}
{{- $names | toJson }}
{{- end }}

{{- define "sidecar-injector.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. */}}
{{- define "sidecar-injector.labels" -}}
helm.sh/chart: {{ include "sidecar-injector.chart" . }}
{{ include "sidecar-injector.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels. */}}
{{- define "sidecar-injector.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sidecar-injector.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The image reference. */}}
{{- define "sidecar-injector.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
