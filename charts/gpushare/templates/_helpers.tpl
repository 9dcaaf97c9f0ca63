{{/* Labels Helm adds to every object (the drift test with kustomize leaves these out). */}}
{{- define "gpushare.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpushare.image" -}}
{{ .image.repository }}:{{ .image.tag | default .appVersion }}
{{- end }}

{{/* The operator, its webhook, Lease and Secret live in the release's namespace. */}}
{{- define "gpushare.operatorNamespace" -}}
{{ .Release.Namespace }}
{{- end }}

{{/* The device plugin's namespace: the release's, or devicePlugin.namespace (which must
exist: the chart creates no namespace). It must admit privileged pods (the hostPath). */}}
{{- define "gpushare.pluginNamespace" -}}
{{ .Values.devicePlugin.namespace | default .Release.Namespace }}
{{- end }}

{{/* A pod template's metadata: the selector labels, then the admin's labels and annotations. */}}
{{- define "gpushare.podMetadata" -}}
labels:
  app.kubernetes.io/name: {{ .name }}
  app.kubernetes.io/part-of: gpushare
  {{- with .values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The Secret cert-manager keeps the webhook's serving certificate in. */}}
{{- define "gpushare.webhookCertSecret" -}}
gpushare-webhook-cert
{{- end }}

{{/*
The Lease term the leader set on the binding gpushare-leader-writes, kept across upgrades (the
leader owns that value; with server-side apply, another would conflict with it); "none" on a
fresh install or where the cluster cannot be read (helm template).
*/}}
{{- define "gpushare.leaseTerm" -}}
{{- $term := "none" -}}
{{- $kind := "ValidatingAdmissionPolicyBinding" -}}
{{- $live := lookup "admissionregistration.k8s.io/v1" $kind "" "gpushare-leader-writes" -}}
{{- range (dig "spec" "matchResources" "objectSelector" "matchExpressions" (list) $live) -}}
{{- if and (eq (get . "key") "gpushare.io/lease-term") (get . "values") -}}
{{- $term = first (get . "values") -}}
{{- end -}}
{{- end -}}
{{- $term -}}
{{- end -}}
