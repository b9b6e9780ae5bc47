package k8scheck

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	istionet "istio.io/api/networking/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// loadBase decodes the kustomize base's files as they are (no kustomize run): the fixture the
// mutation test breaks one check at a time.
func loadBase(t *testing.T) *Objects {
	t.Helper()
	files, err := filepath.Glob("../../kubernetes/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	o := &Objects{}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := DecodeStream(f, data, o); err != nil {
			t.Fatal(err)
		}
	}
	if len(o.StatefulSets) == 0 {
		t.Fatal("no StatefulSet in the base")
	}
	return o
}

// TestStrictDecodeRejects proves that the decoder fails on unknown fields, duplicate fields and unknown kinds.
func TestStrictDecodeRejects(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":       "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {clusterAddress: None}\n",
		"field name case":     "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {clusterIp: None}\n",
		"misplaced field":     "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: x}\nspec: {template: {spec: {containers: [{name: c, readinessProbe: {grpc: {port: 1}, service: x}}]}}}\n",
		"duplicate field":     "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: x}\nspec: {maxUnavailable: 1, maxUnavailable: 2}\n",
		"unknown kind":        "apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n",
		"wrong apiVersion":    "apiVersion: policy/v1beta1\nkind: PodDisruptionBudget\nmetadata: {name: x}\n",
		"missing kind":        "apiVersion: v1\nmetadata: {name: x}\n",
		"bad second doc":      "apiVersion: v1\nkind: Service\nmetadata: {name: x}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: y, lables: {}}\n",
		"wrong value type":    "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: grpc}]}\n",
		"invalid yaml":        "apiVersion: v1\nkind: Service\n  metadata: [\n",
		"string for integer":  "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: x}\nspec: {replicas: \"1\"}\n",
		"rule field misspelt": "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: x}\nspec: {groups: [{name: g, rules: [{alert: A, expression: up}]}]}\n",
		"podmonitor field":    "apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: x}\nspec: {podMetricsEndpoints: [{port: metrics, interval: 30s, scrapeTimeout: 10s, path: /metrics, pathx: /}]}\n",
		"istio spec field":    "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: x}\nspec: {hosts: [x], http: [{retries: {attempts: 1, retryon: unavailable}}]}\n",
		"istio enum value":    "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: x}\nspec: {host: x, trafficPolicy: {tls: {mode: MUTUAL_ISTIO}}}\n",
		"istio no spec":       "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: x}\n",
		"istio metadata":      "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: x, annotation: {}}\nspec: {hosts: [x]}\n",
		"grpcroute field":     "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: x}\nspec: {parentRefs: [{name: s, kind: Service, group: core, prot: 9090}]}\n",
	} {
		t.Run(name, func(t *testing.T) {
			if err := DecodeStream(name, []byte(doc), &Objects{}); err == nil {
				t.Errorf("decoded without error:\n%s", doc)
			}
		})
	}
	t.Run("every kind decodes", func(t *testing.T) {
		o := &Objects{}
		doc := `apiVersion: v1
kind: ConfigMap
metadata: {name: x}
data: {a: b}
---
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata: {name: x}
spec: {podMetricsEndpoints: [{port: metrics}]}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: x}
spec: {endpoints: [{port: http-metrics}]}
---
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: x}
spec: {groups: [{name: g, rules: [{alert: A, expr: up == 0, for: 5m}]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: x}
spec: {hosts: [x], http: [{retries: {attempts: 2, retryOn: unavailable}, route: [{destination: {host: x}}]}]}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: x}
spec: {host: x, trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: x, annotations: {retry.linkerd.io/grpc: unavailable}}
spec: {parentRefs: [{name: s, kind: Service, group: core, port: 9090}]}
`
		if err := DecodeStream("kinds", []byte(doc), o); err != nil {
			t.Fatal(err)
		}
		if o.Count() != 7 || o.VirtualServices[0].Spec.GetHttp()[0].GetRetries().GetRetryOn() != "unavailable" ||
			o.DestinationRules[0].Spec.GetTrafficPolicy().GetTls().GetMode().String() != "ISTIO_MUTUAL" {
			t.Errorf("decoded %d objects: %+v", o.Count(), o)
		}
		if c := o.Clone(); c.Count() != 7 || c.VirtualServices[0].Spec == o.VirtualServices[0].Spec {
			t.Error("Clone did not copy the Istio specs")
		}
	})
	t.Run("comments and empty documents are skipped", func(t *testing.T) {
		o := &Objects{}
		doc := "# header\n---\n\n--- # note\napiVersion: v1\nkind: Service\nmetadata: {name: x}\n---\n"
		if err := DecodeStream("ok", []byte(doc), o); err != nil || len(o.Services) != 1 {
			t.Errorf("err=%v services=%d, want nil and 1", err, len(o.Services))
		}
	})
}

// TestManifestChecksCatchMutations proves that each check fails on a manifest that breaks it.
func TestManifestChecksCatchMutations(t *testing.T) {
	base := loadBase(t)
	if p := Check(base); len(p) != 0 {
		t.Fatalf("the manifests themselves fail: %v", p)
	}
	sts := func(m *Objects) *appsv1.StatefulSet { return m.StatefulSets[0] }
	pod := func(m *Objects) *corev1.PodSpec { return &sts(m).Spec.Template.Spec }
	ctr := func(m *Objects) *corev1.Container { return findContainer(pod(m), ContainerName) }
	setEnv := func(m *Objects, name, value string) {
		c := ctr(m)
		for i := range c.Env {
			if c.Env[i].Name == name {
				c.Env[i].Value = value
				return
			}
		}
		c.Env = append(c.Env, corev1.EnvVar{Name: name, Value: value})
	}
	delEnv := func(m *Objects, name string) {
		c := ctr(m)
		c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
	}
	setPort := func(m *Objects, name string, port int32) {
		c := ctr(m)
		for i := range c.Ports {
			if c.Ports[i].Name == name {
				c.Ports[i].ContainerPort = port
			}
		}
	}
	svc := func(m *Objects, headless bool) *corev1.Service {
		for _, s := range m.Services {
			if isHeadless(s) == headless {
				return s
			}
		}
		t.Fatalf("no Service with headless=%v", headless)
		return nil
	}
	svcPort := func(m *Objects, headless bool, name string) *corev1.ServicePort {
		sp := servicePort(svc(m, headless), name)
		if sp == nil {
			t.Fatalf("no Service port %q", name)
		}
		return sp
	}
	ptr := func(v bool) *bool { return &v }
	i64 := func(v int64) *int64 { return &v }

	for _, tc := range []struct {
		name   string
		mutate func(m *Objects)
		want   string
	}{
		{"no StatefulSet", func(m *Objects) { m.StatefulSets = nil }, "exactly 1 StatefulSet"},
		{"sts selector mismatch", func(m *Objects) { sts(m).Spec.Selector.MatchLabels["app.kubernetes.io/name"] = "other" }, "StatefulSet: selector"},
		{"sts selector empty", func(m *Objects) { sts(m).Spec.Selector = &metav1.LabelSelector{} }, "StatefulSet: empty selector"},
		{"container renamed", func(m *Objects) { ctr(m).Name = "app" }, "no container named"},
		{"grpc port", func(m *Objects) { setPort(m, GRPCPortName, 8080) }, `container port "grpc"`},
		{"metrics port", func(m *Objects) { setPort(m, MetricsPortName, 8081) }, `container port "metrics"`},
		{"udp port", func(m *Objects) { ctr(m).Ports[0].Protocol = corev1.ProtocolUDP }, "want TCP"},
		{"listen env port", func(m *Objects) { setEnv(m, "STORAGED_LISTEN", ":9999") }, "STORAGED_LISTEN"},
		{"listen env loopback", func(m *Objects) { setEnv(m, "STORAGED_LISTEN", "127.0.0.1:9090") }, "all interfaces"},
		{"metrics env port", func(m *Objects) { setEnv(m, "STORAGED_METRICS_LISTEN", ":9999") }, "STORAGED_METRICS_LISTEN"},
		{"flush mode", func(m *Objects) { setEnv(m, "STORAGED_FLUSH_MODE", "never") }, "STORAGED_FLUSH_MODE"},
		{"log format", func(m *Objects) { setEnv(m, "STORAGED_LOG_FORMAT", "text") }, "STORAGED_LOG_FORMAT"},
		{"no startup probe", func(m *Objects) { ctr(m).StartupProbe = nil }, "startupProbe: missing"},
		{"tcp readiness", func(m *Objects) {
			ctr(m).ReadinessProbe.ProbeHandler = corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(9090)}}
		}, "readinessProbe: must be an httpGet probe"},
		{"grpc liveness", func(m *Objects) {
			ctr(m).LivenessProbe.ProbeHandler = corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: 9090}}
		}, "livenessProbe: must be an httpGet probe"},
		{"liveness wrong port", func(m *Objects) { ctr(m).LivenessProbe.HTTPGet.Port = intstr.FromInt32(9090) }, "livenessProbe: httpGet port"},
		{"readiness unknown port name", func(m *Objects) { ctr(m).ReadinessProbe.HTTPGet.Port = intstr.FromString("http") }, "readinessProbe: httpGet port"},
		{"readiness on livez", func(m *Objects) { ctr(m).ReadinessProbe.HTTPGet.Path = LivezPath }, "readinessProbe: httpGet path"},
		{"liveness on readyz", func(m *Objects) { ctr(m).LivenessProbe.HTTPGet.Path = ReadyzPath }, "livenessProbe: httpGet path"},
		{"startup with query", func(m *Objects) { ctr(m).StartupProbe.HTTPGet.Path = LivezPath + "?x=1" }, "startupProbe: httpGet path"},
		{"https probe", func(m *Objects) { ctr(m).LivenessProbe.HTTPGet.Scheme = corev1.URISchemeHTTPS }, "want HTTP"},
		{"probe header", func(m *Objects) {
			ctr(m).ReadinessProbe.HTTPGet.HTTPHeaders = []corev1.HTTPHeader{{Name: "Host", Value: "x"}}
		}, "host/headers"},
		{"metrics server off", func(m *Objects) { setEnv(m, "STORAGED_METRICS_LISTEN", "") }, "also serves the probes"},
		{"startup budget short", func(m *Objects) { ctr(m).StartupProbe.FailureThreshold = 3 }, "startupProbe: tolerates only"},
		{"no pod IP", func(m *Objects) { delEnv(m, "POD_IP") }, "fieldRef status.podIP"},
		{"no store host", func(m *Objects) { delEnv(m, "STORAGED_STORE_HOST") }, "STORAGED_STORE_HOST must be set"},
		{"store host literal", func(m *Objects) { setEnv(m, "STORAGED_STORE_HOST", "10.0.0.1:9090") }, "STORAGED_STORE_HOST="},
		{"store host wrong port", func(m *Objects) { setEnv(m, "STORAGED_STORE_HOST", "$(POD_IP):10911") }, "STORAGED_STORE_HOST="},
		{"store host before pod IP", func(m *Objects) {
			c := ctr(m)
			i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_IP" })
			e := c.Env[i]
			c.Env = append(slices.Delete(c.Env, i, i+1), e)
		}, "must come before STORAGED_STORE_HOST"},
		{"pod IP from host IP", func(m *Objects) {
			c := ctr(m)
			i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_IP" })
			c.Env[i].ValueFrom.FieldRef.FieldPath = "status.hostIP"
		}, "fieldRef status.podIP"},
		{"headless hides not-ready pods", func(m *Objects) { svc(m, true).Spec.PublishNotReadyAddresses = false }, "publishNotReadyAddresses"},
		{"no preStop", func(m *Objects) { ctr(m).Lifecycle = nil }, "lifecycle.preStop"},
		{"grace too short", func(m *Objects) { pod(m).TerminationGracePeriodSeconds = i64(45) }, "terminationGracePeriodSeconds"},
		{"grace default", func(m *Objects) { pod(m).TerminationGracePeriodSeconds = nil }, "terminationGracePeriodSeconds"},
		{"shutdown timeout longer", func(m *Objects) { setEnv(m, "STORAGED_SHUTDOWN_TIMEOUT", "2m") }, "terminationGracePeriodSeconds"},
		{"shutdown timeout invalid", func(m *Objects) { setEnv(m, "STORAGED_SHUTDOWN_TIMEOUT", "40") }, "STORAGED_SHUTDOWN_TIMEOUT"},
		{"no data dir env", func(m *Objects) { delEnv(m, "STORAGED_DATA_DIR") }, "STORAGED_DATA_DIR must be set"},
		{"data dir env elsewhere", func(m *Objects) { setEnv(m, "STORAGED_DATA_DIR", "/data") }, "STORAGED_DATA_DIR"},
		{"mount path differs", func(m *Objects) { ctr(m).VolumeMounts[0].MountPath = "/data" }, "no volumeMount at STORAGED_DATA_DIR"},
		{"mount read-only", func(m *Objects) { ctr(m).VolumeMounts[0].ReadOnly = true }, "must be writable"},
		{"mount not a claim", func(m *Objects) { sts(m).Spec.VolumeClaimTemplates[0].Name = "other" }, "not a volumeClaimTemplate"},
		{"claim without size", func(m *Objects) { sts(m).Spec.VolumeClaimTemplates[0].Spec.Resources.Requests = nil }, "no storage request"},
		{"pod runAsNonRoot", func(m *Objects) { pod(m).SecurityContext.RunAsNonRoot = nil }, "pod securityContext.runAsNonRoot"},
		{"container runAsNonRoot", func(m *Objects) { ctr(m).SecurityContext.RunAsNonRoot = ptr(false) }, "container securityContext.runAsNonRoot"},
		{"pod runAsUser root", func(m *Objects) { pod(m).SecurityContext.RunAsUser = i64(0) }, "pod runAsUser"},
		{"pod runAsGroup", func(m *Objects) { pod(m).SecurityContext.RunAsGroup = i64(1000) }, "pod runAsGroup"},
		{"no fsGroup", func(m *Objects) { pod(m).SecurityContext.FSGroup = nil }, "pod fsGroup"},
		{"container runAsUser", func(m *Objects) { ctr(m).SecurityContext.RunAsUser = i64(1000) }, "container runAsUser"},
		{"container runAsGroup", func(m *Objects) { ctr(m).SecurityContext.RunAsGroup = i64(0) }, "container runAsGroup"},
		{"writable root fs", func(m *Objects) { ctr(m).SecurityContext.ReadOnlyRootFilesystem = nil }, "readOnlyRootFilesystem"},
		{"privilege escalation", func(m *Objects) { ctr(m).SecurityContext.AllowPrivilegeEscalation = ptr(true) }, "allowPrivilegeEscalation"},
		{"privileged", func(m *Objects) { ctr(m).SecurityContext.Privileged = ptr(true) }, "privileged"},
		{"caps not dropped", func(m *Objects) { ctr(m).SecurityContext.Capabilities.Drop = []corev1.Capability{"NET_RAW"} }, "capabilities"},
		{"caps added", func(m *Objects) { ctr(m).SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_ADMIN"} }, "capabilities"},
		{"pod seccomp", func(m *Objects) { pod(m).SecurityContext.SeccompProfile = nil }, "pod securityContext.seccompProfile"},
		{"container seccomp", func(m *Objects) {
			ctr(m).SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		}, "container securityContext.seccompProfile"},
		{"service links", func(m *Objects) { pod(m).EnableServiceLinks = nil }, "enableServiceLinks"},
		{"no cpu request", func(m *Objects) { delete(ctr(m).Resources.Requests, corev1.ResourceCPU) }, "requests.cpu"},
		{"no memory request", func(m *Objects) { delete(ctr(m).Resources.Requests, corev1.ResourceMemory) }, "requests.memory"},
		{"no memory limit", func(m *Objects) { ctr(m).Resources.Limits = nil }, "limits.memory"},
		{"no GOMEMLIMIT", func(m *Objects) { delEnv(m, "GOMEMLIMIT") }, "GOMEMLIMIT must be set"},
		{"GOMEMLIMIT invalid", func(m *Objects) { setEnv(m, "GOMEMLIMIT", "1.5GB") }, "invalid GOMEMLIMIT"},
		{"GOMEMLIMIT at limit", func(m *Objects) { setEnv(m, "GOMEMLIMIT", "2GiB") }, "not below"},
		{"service selector mismatch", func(m *Objects) { svc(m, false).Spec.Selector["app.kubernetes.io/name"] = "other" }, "does not match pod template labels"},
		{"service selector empty", func(m *Objects) { svc(m, true).Spec.Selector = nil }, "empty selector"},
		{"grpc port renamed", func(m *Objects) { svcPort(m, false, GRPCPortName).Name = "tcp" }, `no port named "grpc"`},
		{"grpc appProtocol", func(m *Objects) { svcPort(m, false, GRPCPortName).AppProtocol = nil }, "appProtocol"},
		{"headless appProtocol", func(m *Objects) {
			h := "http"
			svcPort(m, true, GRPCPortName).AppProtocol = &h
		}, "appProtocol"},
		{"grpc targets metrics", func(m *Objects) { svcPort(m, false, GRPCPortName).TargetPort = intstr.FromString(MetricsPortName) }, "targets container port"},
		{"grpc targets wrong number", func(m *Objects) { svcPort(m, true, GRPCPortName).TargetPort = intstr.FromInt32(8080) }, "targets container port"},
		{"grpc target unknown name", func(m *Objects) { svcPort(m, false, GRPCPortName).TargetPort = intstr.FromString("gprc") }, "targets container port"},
		{"metrics target", func(m *Objects) { svcPort(m, false, ServicePortMetrics).TargetPort = intstr.FromInt32(9090) }, `"http-metrics" targets`},
		{"no metrics service port", func(m *Objects) {
			s := svc(m, false)
			s.Spec.Ports = slices.DeleteFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ServicePortMetrics })
		}, `no port named "http-metrics"`},
		{"no ClusterIP service", func(m *Objects) { svc(m, false).Spec.Type = corev1.ServiceTypeNodePort }, "no ClusterIP Service"},
		{"serviceName unknown", func(m *Objects) { sts(m).Spec.ServiceName = "nope" }, "no such Service"},
		{"serviceName not headless", func(m *Objects) { sts(m).Spec.ServiceName = svc(m, false).Name }, "not headless"},
		{"governing service given a cluster IP", func(m *Objects) {
			h := svc(m, true)
			h.Spec.ClusterIP = ""
			sts(m).Spec.ServiceName = h.Name
		}, "not headless"},
		{"no PDB", func(m *Objects) { m.PDBs = nil }, "no PodDisruptionBudget"},
		{"PDB selector mismatch", func(m *Objects) { m.PDBs[0].Spec.Selector.MatchLabels["app.kubernetes.io/component"] = "x" }, "PodDisruptionBudget storaged: selector"},
		{"PDB selector empty", func(m *Objects) { m.PDBs[0].Spec.Selector = nil }, "PodDisruptionBudget storaged: empty selector"},
		{"PDB no budget", func(m *Objects) { m.PDBs[0].Spec.MaxUnavailable = nil }, "exactly one of minAvailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := base.Clone()
			tc.mutate(m)
			p := Check(m)
			if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("want a problem containing %q, got %q", tc.want, p)
			}
		})
	}
}

// TestMeshChecksCatchMutations proves that each mesh check fails on objects that break it.
func TestMeshChecksCatchMutations(t *testing.T) {
	base := loadBase(t)
	vsDoc := "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: storaged}\n" +
		"spec: {hosts: [storaged], http: [{name: grpc, route: [{destination: {host: storaged, port: {number: 9090}}}], retries: {attempts: 2, retryOn: unavailable}}]}\n" +
		"---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: storaged}\nspec: {host: storaged, trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}}\n"
	routeDoc := "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: storaged, annotations: {retry.linkerd.io/grpc: unavailable}}\n" +
		"spec: {parentRefs: [{name: storaged, kind: Service, group: core, port: 9090}]}\n"
	with := func(doc string, ann map[string]string) *Objects {
		o := base.Clone()
		if err := DecodeStream("mesh", []byte(doc), o); err != nil {
			t.Fatal(err)
		}
		o.StatefulSets[0].Spec.Template.Annotations = ann
		return o
	}
	istio := func() *Objects { return with(vsDoc, map[string]string{istioNative: "true"}) }
	linkerd := func() *Objects {
		return with(routeDoc, map[string]string{linkerdInject: "enabled", linkerdNativeBeta: "true"})
	}
	for name, m := range map[string]Mesh{"istio": {Istio: true, Native: true}, "linkerd": {Linkerd: true, Native: true}} {
		o := istio()
		if name == "linkerd" {
			o = linkerd()
		}
		if p := CheckMesh(o, m); len(p) != 0 {
			t.Fatalf("%s fixture fails: %v", name, p)
		}
	}
	if p := CheckMesh(base, Mesh{}); len(p) != 0 {
		t.Fatalf("base without mesh fails: %v", p)
	}
	vs := func(o *Objects) *istionet.HTTPRoute { return o.VirtualServices[0].Spec.GetHttp()[0] }
	for _, tc := range []struct {
		name   string
		mesh   Mesh
		build  func() *Objects
		mutate func(o *Objects)
		want   string
	}{
		{"istio annotation without istio", Mesh{}, istio, func(o *Objects) { o.VirtualServices, o.DestinationRules = nil, nil }, "without Istio"},
		{"istio objects without istio", Mesh{}, istio, func(o *Objects) { o.StatefulSets[0].Spec.Template.Annotations = nil }, "Istio objects"},
		{"linkerd route without linkerd", Mesh{}, linkerd, func(o *Objects) { o.StatefulSets[0].Spec.Template.Annotations = nil }, "GRPCRoute without"},
		{"no native annotation", Mesh{Istio: true, Native: true}, istio, func(o *Objects) { delete(o.StatefulSets[0].Spec.Template.Annotations, istioNative) }, "native sidecar"},
		{"classic without config", Mesh{Istio: true}, istio, func(o *Objects) {}, "proxy.istio.io/config"},
		{"classic no hold", Mesh{Istio: true}, istio, func(o *Objects) {
			o.StatefulSets[0].Spec.Template.Annotations[istioProxyConfig] = `{"terminationDrainDuration": "50s"}`
		}, "holdApplicationUntilProxyStarts"},
		{"classic drain short", Mesh{Istio: true}, istio, func(o *Objects) {
			o.StatefulSets[0].Spec.Template.Annotations[istioProxyConfig] = `{"holdApplicationUntilProxyStarts": true, "terminationDrainDuration": "5s"}`
		}, "terminationDrainDuration 5s"},
		{"classic drain past grace", Mesh{Istio: true}, istio, func(o *Objects) {
			o.StatefulSets[0].Spec.Template.Annotations[istioProxyConfig] = `{"holdApplicationUntilProxyStarts": true, "terminationDrainDuration": "90s"}`
		}, "terminationDrainDuration 1m30s"},
		{"retry on cancelled", Mesh{Istio: true, Native: true}, istio, func(o *Objects) { vs(o).Retries.RetryOn = "unavailable,cancelled" }, "want exactly"},
		{"retry on 5xx", Mesh{Istio: true, Native: true}, istio, func(o *Objects) { vs(o).Retries.RetryOn = "5xx" }, "want exactly"},
		{"no retries block", Mesh{Istio: true, Native: true}, istio, func(o *Objects) { vs(o).Retries = nil }, "no retries block"},
		{"no http route", Mesh{Istio: true, Native: true}, istio, func(o *Objects) { o.VirtualServices[0].Spec.Http = nil }, "no http route"},
		{"per try timeout", Mesh{Istio: true, Native: true}, istio, func(o *Objects) { vs(o).Retries.PerTryTimeout = durationpb.New(time.Second) }, "perTryTimeout"},
		{"route timeout", Mesh{Istio: true, Native: true}, istio, func(o *Objects) { vs(o).Timeout = durationpb.New(15 * time.Second) }, "cut streams"},
		{"vs other host", Mesh{Istio: true, Native: true}, istio, func(o *Objects) { o.VirtualServices[0].Spec.Hosts = []string{"other"} }, "do not name"},
		{"vs metrics port", Mesh{Istio: true, Native: true}, istio, func(o *Objects) { vs(o).Route[0].Destination.Port.Number = 9091 }, "destination"},
		{"dr plaintext", Mesh{Istio: true, Native: true}, istio, func(o *Objects) {
			o.DestinationRules[0].Spec.TrafficPolicy.Tls.Mode = istionet.ClientTLSSettings_DISABLE
		}, "ISTIO_MUTUAL"},
		{"no destination rule", Mesh{Istio: true, Native: true}, istio, func(o *Objects) { o.DestinationRules = nil }, "want 1 VirtualService"},
		{"not injected", Mesh{Linkerd: true, Native: true}, linkerd, func(o *Objects) { delete(o.StatefulSets[0].Spec.Template.Annotations, linkerdInject) }, "linkerd.io/inject"},
		{"linkerd not native", Mesh{Linkerd: true, Native: true}, linkerd, func(o *Objects) {
			delete(o.StatefulSets[0].Spec.Template.Annotations, linkerdNativeBeta)
		}, "native sidecar"},
		{"linkerd wait short", Mesh{Linkerd: true}, linkerd, func(o *Objects) { o.StatefulSets[0].Spec.Template.Annotations[linkerdWaitBefore] = "5" }, "proxy-wait-before-exit-seconds"},
		{"linkerd retry internal", Mesh{Linkerd: true, Native: true}, linkerd, func(o *Objects) { o.GRPCRoutes[0].Annotations[linkerdRetryGRPC] = "internal" }, "want exactly"},
		{"linkerd retry timeout", Mesh{Linkerd: true, Native: true}, linkerd, func(o *Objects) { o.GRPCRoutes[0].Annotations["retry.linkerd.io/timeout"] = "1s" }, "no timeouts"},
		{"linkerd request timeout", Mesh{Linkerd: true, Native: true}, linkerd, func(o *Objects) { o.GRPCRoutes[0].Annotations["timeout.linkerd.io/request"] = "15s" }, "no timeouts"},
		{"route other service", Mesh{Linkerd: true, Native: true}, linkerd, func(o *Objects) { o.GRPCRoutes[0].Spec.ParentRefs[0].Name = "other" }, "no parentRef"},
		{"route metrics port", Mesh{Linkerd: true, Native: true}, linkerd, func(o *Objects) {
			port := gatewayv1.PortNumber(9091)
			o.GRPCRoutes[0].Spec.ParentRefs[0].Port = &port
		}, "no parentRef"},
		{"no route", Mesh{Linkerd: true, Native: true}, linkerd, func(o *Objects) { o.GRPCRoutes = nil }, "want 1 GRPCRoute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.build()
			tc.mutate(o)
			p := CheckMesh(o, tc.mesh)
			if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("want a problem containing %q, got %q", tc.want, p)
			}
		})
	}
}
