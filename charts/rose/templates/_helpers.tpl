{{/*
How a manifest from files/ (the repository's manifests/) becomes a chart object: namespaced objects
and ServiceAccount binding subjects move to the release namespace, the chart's labels are added,
and the workloads get the image, GPU mode and environment from the values.
*/}}
{{- define "rose.clusterScoped" -}}
Namespace CustomResourceDefinition ClusterRole ClusterRoleBinding DeviceClass PriorityClass ValidatingAdmissionPolicy ValidatingAdmissionPolicyBinding MutatingAdmissionPolicy MutatingAdmissionPolicyBinding RuntimeClass
{{- end }}

{{/*
Environment variables values.env may not set, by workload: they switch protections off (the
time-slice orchestrator's TLS, caller authentication and job check). Setting one fails the render
instead of silently dropping the protection (docs/security.md, "Time-slice orchestrator").
*/}}
{{- define "rose.protectedEnv" -}}
rose-timeslice: [ROSE_TIMESLICE_INSECURE, ROSE_TIMESLICE_AUTHENTICATE, ROSE_TIMESLICE_JOB_CHECK, ROSE_TIMESLICE_TLS_CERT, ROSE_TIMESLICE_TLS_KEY, ROSE_TIMESLICE_TOKEN_AUDIENCE]
{{- end }}

{{- define "rose.labels" -}}
app.kubernetes.io/part-of: rose
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "rose.image" -}}
{{ printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "rose.adjust" }}
{{- $obj := .obj }}
{{- $root := .root }}
{{- $ns := $root.Release.Namespace }}
{{- if not (has $obj.kind (splitList " " (include "rose.clusterScoped" $root))) }}
{{- $_ := set $obj.metadata "namespace" $ns }}
{{- end }}
{{- range $s := ($obj.subjects | default list) }}
{{- if eq $s.kind "ServiceAccount" }}{{ $_ := set $s "namespace" $ns }}{{ end }}
{{- end }}
{{- $_ := set $obj.metadata "labels" (merge (fromYaml (include "rose.labels" $root)) ($obj.metadata.labels | default dict)) }}
{{- if has $obj.kind (list "Deployment" "DaemonSet") }}
{{- include "rose.workload" . }}
{{- end }}
{{- end }}

{{- define "rose.workload" }}
{{- $obj := .obj }}
{{- $root := .root }}
{{- $v := $root.Values }}
{{- $pod := $obj.spec.template.spec }}
{{- $env := deepCopy (index ($v.env | default dict) $obj.metadata.name | default dict) }}
{{- range $k := (index (fromYaml (include "rose.protectedEnv" $root)) $obj.metadata.name | default list) }}
{{- if hasKey $env $k }}{{ fail (printf "values.env.%s.%s would switch a protection off: it cannot be set from values (docs/security.md)" $obj.metadata.name $k) }}{{ end }}
{{- end }}
{{- if eq $obj.metadata.name "rose-dra-driver" }}
{{- if eq $v.gpus.mode "simulated" }}
{{- $env = merge $env (dict "ROSE_DRIVER_GPU_BACKEND" "simulated" "ROSE_DRIVER_SIMULATED_GPUS" (toString $v.gpus.simulated.count) "ROSE_DRIVER_SUSPEND_BACKENDS" "cooperative" "ROSE_DRIVER_HOST_MEMORY_BUDGET" $v.gpus.simulated.hostMemoryBudget) }}
{{- else if eq $v.gpus.mode "nvidia" }}
{{- if $v.gpus.nvidia.runtimeClassName }}{{ $_ := set $pod "runtimeClassName" $v.gpus.nvidia.runtimeClassName }}{{ end }}
{{- $env = merge $env (dict "NVIDIA_VISIBLE_DEVICES" "all" "NVIDIA_DRIVER_CAPABILITIES" "compute,utility") }}
{{- else }}
{{- fail (printf "gpus.mode is %q: set it to nvidia (real GPUs) or simulated (kind, demos)" $v.gpus.mode) }}
{{- end }}
{{- include "rose.driverSpill" (dict "pod" $pod "env" $env "root" $root) }}
{{- end }}
{{- range $c := $pod.containers }}
{{- if hasPrefix "ghcr.io/rose-project/rose:" $c.image }}
{{- $_ := set $c "image" (include "rose.image" $root) }}
{{- $_ := set $c "imagePullPolicy" $v.image.pullPolicy }}
{{- $new := list }}
{{- $seen := dict }}
{{- range $e := ($c.env | default list) }}
{{- if hasKey $env $e.name }}
{{- $new = append $new (dict "name" $e.name "value" (toString (index $env $e.name))) }}
{{- $_ := set $seen $e.name true }}
{{- else }}
{{- $new = append $new $e }}
{{- end }}
{{- end }}
{{- range $k := (keys $env | sortAlpha) }}
{{- if not (hasKey $seen $k) }}{{ $new = append $new (dict "name" $k "value" (toString (index $env $k))) }}{{ end }}
{{- end }}
{{- $_ := set $c "env" $new }}
{{- else if eq $c.name "kube-scheduler" }}
{{- $_ := set $c "image" $v.scheduler.image }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The driver's disk tier for suspended GPU state (issue 27 §4; dra_driver/README.md, "Layered memory"):
with driver.spill.enabled the node's driver.spill.hostPath is mounted at the same path in the driver
container (hostPath DirectoryOrCreate; the same path, because each lent claim's CDI spec mounts
its spill directory <hostPath>/claims/<claimUID> by the driver's path of it) and
ROSE_DRIVER_SPILL_DIR / ROSE_DRIVER_SPILL_BUDGET_BYTES are set; the driver gets CAP_CHOWN (it gives
each spill file it creates to the workload process's uid, read from /proc: without it a non-root
workload's spill is refused). A path that overlaps one of the driver's other mounts is refused.
Disabled (the default), the DaemonSet is unchanged.
*/}}
{{- define "rose.driverSpill" }}
{{- $spill := (($.root.Values.driver | default dict).spill | default dict) }}
{{- if $spill.enabled }}
{{- $budget := "" }}
{{- if kindIs "float64" $spill.budget }}{{ $budget = toString (int64 $spill.budget) }}{{ else if hasKey $spill "budget" }}{{ $budget = toString $spill.budget }}{{ end }}
{{- if not (and (regexMatch "^([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$" $budget) (regexMatch "[1-9]" $budget)) }}
{{- fail (printf "driver.spill.budget is %q: set the bytes the disk tier may hold as a quantity above zero, like 200Gi" $budget) }}
{{- end }}
{{- $path := trimSuffix "/" (toString ($spill.hostPath | default "")) }}
{{- if not (hasPrefix "/" $path) }}
{{- fail (printf "driver.spill.hostPath is %q: set an absolute directory on the node other than /, like /var/lib/rose/spill" (toString ($spill.hostPath | default ""))) }}
{{- end }}
{{- range $c := $.pod.containers }}
{{- if eq $c.name "driver" }}
{{- range $m := ($c.volumeMounts | default list) }}
{{- if or (eq $m.mountPath $path) (hasPrefix (printf "%s/" $m.mountPath) $path) (hasPrefix (printf "%s/" $path) $m.mountPath) }}
{{- fail (printf "driver.spill.hostPath %q overlaps the driver's mount %s: choose a directory of its own, like /var/lib/rose/spill" $path $m.mountPath) }}
{{- end }}
{{- end }}
{{- $_ := set $c "volumeMounts" (append ($c.volumeMounts | default list) (dict "name" "spill" "mountPath" $path)) }}
{{- $sc := $c.securityContext | default dict }}
{{- $caps := $sc.capabilities | default dict }}
{{- $_ := set $caps "add" (append ($caps.add | default list) "CHOWN") }}
{{- $_ := set $sc "capabilities" $caps }}
{{- $_ := set $c "securityContext" $sc }}
{{- end }}
{{- end }}
{{- $_ := set $.env "ROSE_DRIVER_SPILL_DIR" $path }}
{{- $_ := set $.env "ROSE_DRIVER_SPILL_BUDGET_BYTES" $budget }}
{{- $_ := set $.pod "volumes" (append ($.pod.volumes | default list) (dict "name" "spill" "hostPath" (dict "path" $path "type" "DirectoryOrCreate"))) }}
{{- end }}
{{- end }}
