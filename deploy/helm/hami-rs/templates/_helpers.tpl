{{- /*
Shared pieces of the templates. The typed manifests (crates/manifests) build the same
objects; tests render this chart with Helm's own engine and compare object by object.
*/ -}}

{{- /* Refuse clusters outside the supported range, at render time. */ -}}
{{- define "hami.kubeVersionCheck" -}}
{{- if not (semverCompare ">=1.27.0-0 <1.38.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "Kubernetes %s is not supported: hami-rs supports 1.27 to 1.37" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}

{{- /* Standard labels of a component: include "hami.labels" "hami-scheduler". */ -}}
{{- define "hami.labels" -}}
app.kubernetes.io/name: hami-rs
app.kubernetes.io/component: {{ . }}
{{- end -}}

{{- /* The cluster's upstream release, vendor suffixes (-eks-…, -gke.…, +k3s1) dropped. */ -}}
{{- define "hami.kubeRelease" -}}
{{- regexReplaceAll "[-+].*$" .Capabilities.KubeVersion.Version "" -}}
{{- end -}}

{{- /* kube-scheduler image: the configured tag, else the cluster's own release. */ -}}
{{- define "hami.kubeSchedulerImage" -}}
{{- $i := .Values.scheduler.kubeScheduler.image -}}
{{- printf "%s/%s:%s" $i.registry $i.repository (default (include "hami.kubeRelease" .) $i.tag) -}}
{{- end -}}

{{- /* "true" where webhooks have matchConditions on by default (beta 1.28, GA 1.30). */ -}}
{{- define "hami.hasMatchConditions" -}}
{{- if semverCompare ">=1.28.0-0" .Capabilities.KubeVersion.Version }}true{{ end -}}
{{- end -}}

{{- define "hami.webhookFailurePolicy" -}}
{{- if include "hami.hasMatchConditions" . }}Fail{{ else }}{{ .Values.webhook.failurePolicyWithoutMatchConditions }}{{ end -}}
{{- end -}}

{{- /* Pod placement from a component's values: include "hami.placement" .Values.monitor. */ -}}
{{- define "hami.placement" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- /* The extended resources hami-rs manages: hami_protocol::names::managed_resources(). */ -}}
{{- define "hami.managedResources" -}}
amd.com/gpu amd.com/gpumem amd.com/gpumem-percentage amd.com/gpucores nvidia.com/gpu nvidia.com/gpumem nvidia.com/gpumem-percentage nvidia.com/gpucores nvidia.com/priority
{{- end -}}

{{- /* Annotations only the scheduler may set (hami_protocol SCHEDULER_OWNED_ANNOTATIONS). */ -}}
{{- define "hami.schedulerOwnedAnnotations" -}}
hami.io/vgpu-node hami.io/vgpu-time hami.io/bind-phase hami.io/bind-time hami.io/amd-cu-allocated hami.io/amd-devices-to-allocate hami.io/amd-devices-allocated hami.io/vgpu-devices-to-allocate hami.io/vgpu-devices-allocated hami.io/vgpu-mig-allocations hami.io/amd-whole-cards hami.io/nvidia-whole-cards
{{- end -}}

{{- /* Annotations the webhook writes into the creator's own CREATE (hami_protocol
ADMISSION_WRITTEN_ANNOTATIONS, D-33): refused on UPDATE only, since the guard would see
them patched in on CREATE. */ -}}
{{- define "hami.admissionWrittenAnnotations" -}}
hami.io/dra-quota-charge
{{- end -}}

{{- /* What no UPDATE but the writers' may change (crates/manifests update_owned_annotations). */ -}}
{{- define "hami.updateOwnedAnnotations" -}}
{{ include "hami.schedulerOwnedAnnotations" . }} {{ include "hami.admissionWrittenAnnotations" . }}
{{- end -}}


{{- /* CEL list literal of the words of a define: include "hami.celList" "hami.managedResources". */ -}}
{{- define "hami.celList" -}}
{{- $out := list -}}
{{- range (splitList " " (include . nil)) -}}
{{- $out = append $out (printf "'%s'" .) -}}
{{- end -}}
[{{ join ", " $out }}]
{{- end -}}

{{- /* CEL: the object carries a scheduler-owned annotation. */ -}}
{{- define "hami.carriesOwned" -}}
{{- printf "(has(object.metadata.annotations) && %s.exists(a, a in object.metadata.annotations))" (include "hami.celList" "hami.schedulerOwnedAnnotations") -}}
{{- end -}}

{{- /* CEL: an UPDATE that sets, changes or removes a scheduler-owned annotation or the DRA
quota charge (other updates never wait for the scheduler; oldObject is null on CREATE). */ -}}
{{- define "hami.changesOwned" -}}
{{- $v := "(has(%s.metadata.annotations) && a in %s.metadata.annotations ? %s.metadata.annotations[a] : '')" -}}
{{- printf "(request.operation == 'UPDATE' && %s.exists(a, %s != %s))" (include "hami.celList" "hami.updateOwnedAnnotations") (printf $v "object" "object" "object") (printf $v "oldObject" "oldObject" "oldObject") -}}
{{- end -}}

{{- /* The main webhook's expression (crates/manifests objects::webhook_match_expression):
a CREATE of a pod whose app or init container requests or limits a managed resource, or
that carries a scheduler-owned annotation; or an UPDATE that changes such an annotation. */ -}}
{{- define "hami.webhookMatchExpression" -}}
{{- $asks := "(has(c.resources) && ((has(c.resources.limits) && r in c.resources.limits) || (has(c.resources.requests) && r in c.resources.requests)))" -}}
{{- printf "(request.operation != 'UPDATE' && (%s.exists(r, object.spec.containers.exists(c, %s) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, %s))) || %s)) || %s" (include "hami.celList" "hami.managedResources") $asks $asks (include "hami.carriesOwned" .) (include "hami.changesOwned" .) -}}
{{- end -}}

{{- /* The guard webhook's expression: a CREATE carrying one, or an UPDATE changing one or
the DRA quota charge. */ -}}
{{- define "hami.guardMatchExpression" -}}
{{- printf "(request.operation != 'UPDATE' && %s) || %s" (include "hami.carriesOwned" .) (include "hami.changesOwned" .) -}}
{{- end -}}

{{- /* Our components' writes never wait for the webhook (the scheduler's D-4 writers). */ -}}
{{- define "hami.notAWriterExpression" -}}
{{- $ns := .Release.Namespace -}}
{{- $w := list -}}
{{- range (list "hami-scheduler" "hami-device-plugin" "hami-nvidia-device-plugin") -}}
{{- $w = append $w (printf "'system:serviceaccount:%s:%s'" $ns .) -}}
{{- end -}}
!(request.userInfo.username in [{{ join ", " $w }}])
{{- end -}}

{{- /* The device plugin's placement: its values, and with draPlugin.enabled never on a node
labelled hami.io/amd-mode=dra (added to every required node-selector term: terms are ORed).
crates/manifests objects::device_plugin_placement builds the same. */ -}}
{{- define "hami.devicePluginPlacement" -}}
{{- $p := deepCopy .Values.devicePlugin -}}
{{- if .Values.draPlugin.enabled -}}
{{- $notDra := dict "key" "hami.io/amd-mode" "operator" "NotIn" "values" (list "dra") -}}
{{- $affinity := default (dict) $p.affinity -}}
{{- $node := default (dict) (get $affinity "nodeAffinity") -}}
{{- $required := default (dict) (get $node "requiredDuringSchedulingIgnoredDuringExecution") -}}
{{- $terms := list -}}
{{- range (default (list (dict)) (get $required "nodeSelectorTerms")) -}}
{{- $term := deepCopy . -}}
{{- $_ := set $term "matchExpressions" (append (default (list) (get $term "matchExpressions")) $notDra) -}}
{{- $terms = append $terms $term -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $terms -}}
{{- $_ := set $node "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $node -}}
{{- $_ := set $p "affinity" $affinity -}}
{{- end -}}
{{- include "hami.placement" $p -}}
{{- end -}}
