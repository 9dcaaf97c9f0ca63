{{/* Labels Helm adds to every object (the drift test with kustomize leaves these out). */}}
{{- define "gpushare.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpushare.image" -}}
{{ .image.repository }}:{{ .image.tag | default .appVersion }}
{{- end }}
