package helm_test

// The Helm chart deploy/helm/storaged, rendered with the pinned helm (tools/deploy/go.mod) for a
// set of values and decoded strictly into the upstream types: the kustomize base's checks
// (k8scheck.Check) and mesh checks hold for every rendering, the values do what values.yaml says,
// the chart refuses what it documents as refused, and every metric the alerts and the dashboard
// name is served by a real storaged.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/storaged/storaged/deploy/internal/k8scheck"
	"github.com/storaged/storaged/internal/proctest"
)

const (
	chartDir    = "deploy/helm/storaged"
	release     = "storaged"
	namespace   = "store"
	kubeVersion = "1.31.0"
)

// render runs helm template with --set values and decodes the output.
func render(t *testing.T, set ...string) *k8scheck.Objects {
	t.Helper()
	out := k8scheck.Tool(t, "helm", renderArgs(set...)...)
	o := &k8scheck.Objects{}
	if err := k8scheck.DecodeStream("helm template", out, o); err != nil {
		t.Fatal(err)
	}
	return o
}

func renderArgs(set ...string) []string {
	args := []string{"template", release, chartDir, "--namespace", namespace, "--kube-version", kubeVersion}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return args
}

func container(t *testing.T, o *k8scheck.Objects) *corev1.Container {
	t.Helper()
	for i, c := range o.StatefulSets[0].Spec.Template.Spec.Containers {
		if c.Name == k8scheck.ContainerName {
			return &o.StatefulSets[0].Spec.Template.Spec.Containers[i]
		}
	}
	t.Fatal("no storaged container")
	return nil
}

func env(c *corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

// TestChartRenderings renders the chart for each values set: the base checks and the mesh checks
// hold for all of them, and each set's own promise is checked.
func TestChartRenderings(t *testing.T) {
	for _, tc := range []struct {
		name  string
		set   []string
		mesh  k8scheck.Mesh
		check func(t *testing.T, o *k8scheck.Objects)
	}{
		{"defaults", nil, k8scheck.Mesh{}, func(t *testing.T, o *k8scheck.Objects) {
			if len(o.StatefulSets) != 1 || len(o.Services) != 2 || len(o.PDBs) != 1 || o.Count() != 4 {
				t.Errorf("defaults render %d objects, want a StatefulSet, 2 Services and a PDB", o.Count())
			}
			if img := container(t, o).Image; img != "storaged:dev" {
				t.Errorf("image %q, want storaged:dev (the chart's appVersion)", img)
			}
		}},
		{"image, storage, resources, flush", []string{
			"image.repository=registry.example/storaged", "image.digest=sha256:" + strings.Repeat("ab", 32),
			"storage.size=200Gi", "storage.className=fast-ssd", "resources.limits.memory=4Gi", "resources.requests.memory=4Gi",
			"goMemLimit=3GiB", "flush.mode=sync", "flush.syncTimeout=2s", "replicas=3",
		}, k8scheck.Mesh{}, func(t *testing.T, o *k8scheck.Objects) {
			sts := o.StatefulSets[0]
			c := container(t, o)
			if want := "registry.example/storaged@sha256:" + strings.Repeat("ab", 32); c.Image != want {
				t.Errorf("image %q, want %q", c.Image, want)
			}
			vct := sts.Spec.VolumeClaimTemplates[0].Spec
			if q := vct.Resources.Requests[corev1.ResourceStorage]; q.String() != "200Gi" || vct.StorageClassName == nil || *vct.StorageClassName != "fast-ssd" {
				t.Errorf("volume claim %v class %v, want 200Gi fast-ssd", q.String(), vct.StorageClassName)
			}
			if e := env(c); e["STORAGED_FLUSH_MODE"] != "sync" || e["STORAGED_SYNC_FLUSH_TIMEOUT"] != "2s" || e["GOMEMLIMIT"] != "3GiB" {
				t.Errorf("env %v", e)
			}
			if *sts.Spec.Replicas != 3 {
				t.Errorf("replicas %d", *sts.Spec.Replicas)
			}
		}},
		{"istio native", []string{"mesh.istio.enabled=true"}, k8scheck.Mesh{Istio: true, Native: true}, func(t *testing.T, o *k8scheck.Objects) {
			if h := o.VirtualServices[0].Spec.GetHosts(); !slices.Equal(h, []string{release + "." + namespace + ".svc.cluster.local"}) {
				t.Errorf("VirtualService hosts %v", h)
			}
			if ann := o.StatefulSets[0].Spec.Template.Annotations; ann["traffic.sidecar.istio.io/excludeInboundPorts"] != "9091" {
				t.Errorf("annotations %v: metrics port not excluded", ann)
			}
		}},
		{"istio classic", []string{"mesh.istio.enabled=true", "mesh.istio.nativeSidecar=false"}, k8scheck.Mesh{Istio: true}, nil},
		{"linkerd native", []string{"mesh.linkerd.enabled=true"}, k8scheck.Mesh{Linkerd: true, Native: true}, nil},
		{"linkerd classic", []string{"mesh.linkerd.enabled=true", "mesh.linkerd.nativeSidecar=false", "shutdownTimeout=20s",
			"terminationGracePeriodSeconds=40"}, k8scheck.Mesh{Linkerd: true}, func(t *testing.T, o *k8scheck.Objects) {
			if v := o.StatefulSets[0].Spec.Template.Annotations["config.alpha.linkerd.io/proxy-wait-before-exit-seconds"]; v != "30" {
				t.Errorf("proxy-wait-before-exit-seconds %q, want 30 (5 preStop + 20 + 5)", v)
			}
		}},
		{"monitoring", []string{"monitoring.podMonitor.enabled=true", "monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true"},
			k8scheck.Mesh{}, func(t *testing.T, o *k8scheck.Objects) {
				if len(o.PodMonitors) != 1 || len(o.PrometheusRules) != 1 || len(o.ConfigMaps) != 1 {
					t.Fatalf("%d PodMonitors, %d PrometheusRules, %d ConfigMaps, want 1 each", len(o.PodMonitors), len(o.PrometheusRules), len(o.ConfigMaps))
				}
				pm := o.PodMonitors[0]
				if sel := labels.SelectorFromSet(pm.Spec.Selector.MatchLabels); !sel.Matches(labels.Set(o.StatefulSets[0].Spec.Template.Labels)) {
					t.Errorf("PodMonitor selector %v does not select the pods", sel)
				}
				if ep := pm.Spec.PodMetricsEndpoints; len(ep) != 1 || ep[0].Port == nil || *ep[0].Port != k8scheck.MetricsPortName || ep[0].Path != "/metrics" {
					t.Errorf("PodMetricsEndpoints %+v", ep)
				}
				if cm := o.ConfigMaps[0]; cm.Labels["grafana_dashboard"] != "1" || !json.Valid([]byte(cm.Data["storaged.json"])) {
					t.Errorf("dashboard ConfigMap labels %v, JSON valid %v", cm.Labels, json.Valid([]byte(cm.Data["storaged.json"])))
				}
				var alerts []string
				for _, g := range o.PrometheusRules[0].Spec.Groups {
					for _, r := range g.Rules {
						alerts = append(alerts, r.Alert)
					}
				}
				for _, want := range []string{"StoragedDiskFull", "StoragedNotWritable", "StoragedFlushLag", "StoragedScheduleLag"} {
					if !slices.Contains(alerts, want) {
						t.Errorf("alerts %v: no %s", alerts, want)
					}
				}
				if slices.Contains(alerts, "StoragedNoLeader") || slices.Contains(alerts, "StoragedSlowRaftLogSync") {
					t.Errorf("replication's alerts without replication: %v", alerts)
				}
			}},
		{"service monitor", []string{"monitoring.serviceMonitor.enabled=true"}, k8scheck.Mesh{}, func(t *testing.T, o *k8scheck.Objects) {
			sel := labels.SelectorFromSet(o.ServiceMonitors[0].Spec.Selector.MatchLabels)
			var picked []string
			for _, s := range o.Services {
				if sel.Matches(labels.Set(s.Labels)) {
					picked = append(picked, s.Name)
				}
			}
			if !slices.Equal(picked, []string{release + "-headless"}) {
				t.Errorf("ServiceMonitor selects Services %v, want only the headless one (each pod once, ready or not)", picked)
			}
		}},
		{"replication", []string{"replication.enabled=true", "replicas=3", "replication.bootstrapReplicas=3", "flush.mode=sync",
			"monitoring.prometheusRule.enabled=true", "replication.tlsSecretName=storaged-peer-tls"},
			k8scheck.Mesh{}, func(t *testing.T, o *k8scheck.Objects) {
				want := "1=storaged-0.storaged-headless.store.svc:9093,2=storaged-1.storaged-headless.store.svc:9093,3=storaged-2.storaged-headless.store.svc:9093"
				e := env(container(t, o))
				if e["STORAGED_RAFT_FORWARD_PUTS"] != "true" || e["STORAGED_RAFT_FOLLOWER_READS"] != "true" {
					t.Errorf("STORAGED_RAFT_FORWARD_PUTS %q, STORAGED_RAFT_FOLLOWER_READS %q, want true (the Service spreads calls over every member)",
						e["STORAGED_RAFT_FORWARD_PUTS"], e["STORAGED_RAFT_FOLLOWER_READS"])
				}
				if e["STORAGED_RAFT_PEERS"] != want || e["STORAGED_PEER_LISTEN"] != ":9093" || e["STORAGED_RAFT_ID"] != "ordinal" {
					t.Errorf("STORAGED_RAFT_PEERS %q, STORAGED_PEER_LISTEN %q, STORAGED_RAFT_ID %q; want %q, :9093, ordinal",
						e["STORAGED_RAFT_PEERS"], e["STORAGED_PEER_LISTEN"], e["STORAGED_RAFT_ID"], want)
				}
				sts := o.StatefulSets[0]
				if sts.Spec.PodManagementPolicy != "Parallel" {
					t.Errorf("podManagementPolicy %q: a group's pods must start together", sts.Spec.PodManagementPolicy)
				}
				var secret string
				for _, v := range sts.Spec.Template.Spec.Volumes {
					if v.Secret != nil {
						secret = v.Secret.SecretName
					}
				}
				mounted := false
				for _, m := range container(t, o).VolumeMounts {
					mounted = mounted || (m.Name == "peer-tls" && m.MountPath+"/tls.crt" == e["STORAGED_PEER_TLS_CERT"] &&
						m.MountPath+"/ca.crt" == e["STORAGED_PEER_TLS_CA"] && m.MountPath+"/tls.key" == e["STORAGED_PEER_TLS_KEY"])
				}
				if secret != "storaged-peer-tls" || !mounted {
					t.Errorf("peer TLS: secret %q mounted %v (env %q %q %q)", secret, mounted,
						e["STORAGED_PEER_TLS_CERT"], e["STORAGED_PEER_TLS_KEY"], e["STORAGED_PEER_TLS_CA"])
				}
				var alerts []string
				for _, r := range o.PrometheusRules[0].Spec.Groups[0].Rules {
					alerts = append(alerts, r.Alert)
					if r.Alert == "StoragedSlowRaftLogSync" && !strings.Contains(r.Expr.String(), "storaged_raft_log_sync_seconds_bucket[5m]))) > 0.5") {
						t.Errorf("StoragedSlowRaftLogSync: %s", r.Expr.String())
					}
				}
				for _, want := range []string{"StoragedNoLeader", "StoragedSlowRaftLogSync"} {
					if !slices.Contains(alerts, want) {
						t.Errorf("no %s alert with replication (alerts %v)", want, alerts)
					}
				}
				// Nothing joins yet: the ConfigMap the pods read holds no cluster id and no new ids.
				pe := podEnv(t, o, 0)
				if v, ok := pe["STORAGED_RAFT_JOIN_UNLISTED"]; !ok || v != "" {
					t.Errorf("STORAGED_RAFT_JOIN_UNLISTED %q (set %v), want set and empty", v, ok)
				}
				if v, ok := pe["STORAGED_RAFT_ORDINAL_IDS"]; !ok || v != "" {
					t.Errorf("STORAGED_RAFT_ORDINAL_IDS %q (set %v), want set and empty", v, ok)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := render(t, tc.set...)
			for _, p := range append(k8scheck.Check(o), k8scheck.CheckMesh(o, tc.mesh)...) {
				t.Error(p)
			}
			if tc.check != nil {
				tc.check(t, o)
			}
		})
	}
}

// TestChartRefuses: values the chart documents as refused make helm fail with a message saying why.
func TestChartRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		args       []string
	}{
		{"grace shorter than the drain", "terminationGracePeriodSeconds", renderArgs("terminationGracePeriodSeconds=30")},
		{"shutdown timeout not in seconds", "whole seconds", renderArgs("shutdownTimeout=1m")},
		{"unknown flush mode", "flush.mode", renderArgs("flush.mode=never")},
		{"two meshes", "pick one mesh", renderArgs("mesh.istio.enabled=true", "mesh.linkerd.enabled=true")},
		{"two monitors", "enable one", renderArgs("monitoring.podMonitor.enabled=true", "monitoring.serviceMonitor.enabled=true")},
		{"replication with one replica", "replication.enabled needs replicas >= 3", renderArgs(group("replicas=1")...)},
		{"replication with two replicas of three", "replication.enabled needs replicas >= 3", renderArgs(group("replicas=2")...)},
		{"replication async", "flush.mode sync", renderArgs(group("flush.mode=async")...)},
		{"replication without peer TLS", "replication.tlsSecretName", renderArgs(group("replication.tlsSecretName=")...)},
		{"replication without bootstrap size", "replication.enabled needs replication.bootstrapReplicas (0)",
			renderArgs(group("replication.bootstrapReplicas=0")...)},
		{"replication bootstrap of two", "needs replication.bootstrapReplicas (2)", renderArgs(group("replication.bootstrapReplicas=2")...)},
		{"replication bootstrap not a number", "needs replication.bootstrapReplicas (three)",
			renderArgs(group("replication.bootstrapReplicas=three")...)},
		{"growth without cluster id", "replicas 5 > replication.bootstrapReplicas 3: the pods beyond the bootstrap members join",
			renderArgs(group("replicas=5")...)},
		{"new id without cluster id", "replication.memberIds: a pod given a new id joins the running group and needs replication.join.clusterId",
			renderArgs(group("replication.memberIds.1=101")...)},
		{"cluster id malformed", `replication.join.clusterId "94067B9F5089FA4A79DA33D5AA4FD6F2": want the group's cluster id`,
			renderArgs(group("replicas=5", "replication.join.clusterId=94067B9F5089FA4A79DA33D5AA4FD6F2")...)},
		{"new id of a bootstrap member", "replication.memberIds 1: 3 is a bootstrap member's id (1-3)",
			renderArgs(group("replication.join.clusterId="+clusterID, "replication.memberIds.1=3")...)},
		{"new id of another pod", "pods storaged-1 and storaged-5 would both be member 6",
			renderArgs(group("replicas=6", "replication.join.clusterId="+clusterID, "replication.memberIds.1=6")...)},
		{"new id zero", "replication.memberIds 1: 0: want a positive member id",
			renderArgs(group("replication.join.clusterId="+clusterID, "replication.memberIds.1=0")...)},
		{"new id not an ordinal", `replication.memberIds "pod1": want a pod ordinal`,
			renderArgs(group("replication.join.clusterId="+clusterID, "replication.memberIds.pod1=101")...)},
		{"old kubernetes", "kubeVersion", []string{"template", release, chartDir, "--kube-version", "1.29.0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := k8scheck.ToolResult(t, "helm", tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("helm %v: %v, want an error containing %q", tc.args, err, tc.want)
			}
		})
	}
}

// TestChartLint runs helm lint on the chart, with the defaults and with a grown group (which
// renders the replication part of NOTES.txt).
func TestChartLint(t *testing.T) {
	k8scheck.Tool(t, "helm", "lint", chartDir, "--strict", "--kube-version", kubeVersion)
	args := []string{"lint", chartDir, "--strict", "--kube-version", kubeVersion}
	for _, v := range group("replicas=5", "replication.join.clusterId="+clusterID, "replication.memberIds.1=101") {
		args = append(args, "--set", v)
	}
	k8scheck.Tool(t, "helm", args...)
}

// clusterID is the cluster id of a group of members 1, 2, 3 named "default" (cmd/storaged's
// TestReplicationFlags pins the digest).
const clusterID = "94067b9f5089fa4a79da33d5aa4fd6f2"

// group is the --set values of a valid 3-member group, then more (later ones win).
func group(more ...string) []string {
	return append([]string{"replication.enabled=true", "replicas=3", "replication.bootstrapReplicas=3", "flush.mode=sync",
		"replication.tlsSecretName=storaged-peer-tls"}, more...)
}

// podEnv is the environment of the storaged container of pod ordinal as the kubelet makes it: the
// literal values, the keys of the rendered ConfigMaps (a key missing from its ConfigMap fails the
// test: the kubelet would not start the container), the downward API (the pod's name and an IP
// of its own) and $(VAR) references to the variables before.
func podEnv(t *testing.T, o *k8scheck.Objects, ordinal int) map[string]string {
	t.Helper()
	pod := fmt.Sprintf("%s-%d", o.StatefulSets[0].Name, ordinal)
	out := map[string]string{}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, e := range container(t, o).Env {
		v := e.Value
		switch {
		case e.ValueFrom == nil:
			v = ref.ReplaceAllStringFunc(v, func(m string) string {
				if x, ok := out[m[2:len(m)-1]]; ok {
					return x
				}
				return m
			})
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "status.podIP":
				v = fmt.Sprintf("10.0.0.%d", ordinal+1)
			case "metadata.name":
				v = pod
			default:
				t.Fatalf("env %s: fieldRef %s not simulated", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		case e.ValueFrom.ConfigMapKeyRef != nil:
			r := e.ValueFrom.ConfigMapKeyRef
			ok := false
			for _, cm := range o.ConfigMaps {
				if cm.Name == r.Name {
					v, ok = cm.Data[r.Key]
				}
			}
			if !ok && (r.Optional == nil || !*r.Optional) {
				t.Fatalf("env %s: no ConfigMap %s with key %s (the pod would not start)", e.Name, r.Name, r.Key)
			}
		default:
			t.Fatalf("env %s: valueFrom not simulated", e.Name)
		}
		out[e.Name] = v
	}
	return out
}

// chartPodEnv is the replication environment of every pod of a group bootstrapped with 3 members
// (release storaged, namespace store), join the ConfigMap's join-cluster-id and ordinalIDs its
// ordinal-ids: cmd/storaged's chartPodEnv has the same values and TestChartPodIdentity checks what
// the binary makes of them (member 1-3, or a joining member, by the pod's host name).
func chartPodEnv(join, ordinalIDs string) map[string]string {
	return map[string]string{"STORAGED_RAFT_ID": "ordinal", "STORAGED_PEER_LISTEN": ":9093",
		"STORAGED_RAFT_PEERS": "1=storaged-0.storaged-headless.store.svc:9093,2=storaged-1.storaged-headless.store.svc:9093," +
			"3=storaged-2.storaged-headless.store.svc:9093",
		"STORAGED_PEER_TLS_CERT": "/etc/storaged/peer-tls/tls.crt", "STORAGED_PEER_TLS_KEY": "/etc/storaged/peer-tls/tls.key",
		"STORAGED_PEER_TLS_CA": "/etc/storaged/peer-tls/ca.crt", "STORAGED_RAFT_FORWARD_PUTS": "true",
		"STORAGED_RAFT_FOLLOWER_READS": "true", "STORAGED_RAFT_JOIN_UNLISTED": join, "STORAGED_RAFT_ORDINAL_IDS": ordinalIDs}
}

// TestChartGrowAndReplace: growing the group (replicas above bootstrapReplicas, with the cluster
// id) and giving a pod a new member id (memberIds) change the StatefulSet's replicas and the
// ConfigMap only: the pod template is the install's, so a helm upgrade restarts no running member,
// and every pod, bootstrap member or joining one, gets the same replication environment, whose
// STORAGED_RAFT_PEERS is the bootstrap membership of the install.
func TestChartGrowAndReplace(t *testing.T) {
	install := render(t, group()...)
	for _, tc := range []struct {
		name               string
		set                []string
		replicas           int32
		join, ordinalIDs   string
		joiners, bootstrap []int
	}{
		{"install", nil, 3, "", "", nil, []int{0, 1, 2}},
		{"cluster id alone", []string{"replication.join.clusterId=" + clusterID}, 3, clusterID, "", nil, []int{0, 1, 2}},
		{"grown to 5", []string{"replicas=5", "replication.join.clusterId=" + clusterID}, 5, clusterID, "", []int{3, 4}, []int{0, 1, 2}},
		{"pod 1 replaced", []string{"replication.join.clusterId=" + clusterID, "replication.memberIds.1=101"}, 3, clusterID, "1=101",
			[]int{1}, []int{0, 2}},
		{"grown to 5, pods 1 and 3 replaced", []string{"replicas=5", "replication.join.clusterId=" + clusterID,
			"replication.memberIds.1=101", "replication.memberIds.3=102"}, 5, clusterID, "1=101,3=102", []int{1, 3, 4}, []int{0, 2}},
		{"values of chart 0.1.0 reused", []string{"replication.join=null", "replication.memberIds=null"}, 3, "", "", nil,
			[]int{0, 1, 2}},
		{"shrunk to 3 after growing to 5", []string{"replicas=3", "replication.join.clusterId=" + clusterID}, 3, clusterID, "", nil,
			[]int{0, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := render(t, group(tc.set...)...)
			for _, p := range k8scheck.Check(o) {
				t.Error(p)
			}
			sts := o.StatefulSets[0]
			if *sts.Spec.Replicas != tc.replicas {
				t.Errorf("replicas %d, want %d", *sts.Spec.Replicas, tc.replicas)
			}
			if !reflect.DeepEqual(sts.Spec.Template, install.StatefulSets[0].Spec.Template) {
				t.Errorf("the pod template differs from the install's: a helm upgrade would restart every member")
			}
			if len(o.ConfigMaps) != 1 || o.ConfigMaps[0].Name != release+"-replication" {
				t.Fatalf("ConfigMaps %d, want %s-replication", len(o.ConfigMaps), release)
			}
			want := chartPodEnv(tc.join, tc.ordinalIDs)
			for i := range int(tc.replicas) {
				got := podEnv(t, o, i)
				for k, v := range want {
					if got[k] != v {
						t.Errorf("pod %d: %s=%q, want %q", i, k, got[k], v)
					}
				}
				if got["STORAGED_STORE_HOST"] != fmt.Sprintf("10.0.0.%d", i+1) {
					t.Errorf("pod %d: STORAGED_STORE_HOST %q", i, got["STORAGED_STORE_HOST"])
				}
			}
			// Which pods join: a pod whose id (ordinal + 1, or its STORAGED_RAFT_ORDINAL_IDS entry) the
			// rendered STORAGED_RAFT_PEERS lists at its own address is a bootstrap member, any other
			// joins; the binary decides the same from the same environment (cmd/storaged
			// TestChartPodIdentity), and NOTES.txt lists the joining pods to add.
			var joiners, bootstrap []int
			for i := range int(tc.replicas) {
				e := podEnv(t, o, i)
				id := strconv.Itoa(i + 1)
				for _, kv := range strings.Split(e["STORAGED_RAFT_ORDINAL_IDS"], ",") {
					if ord, n, ok := strings.Cut(kv, "="); ok && ord == strconv.Itoa(i) {
						id = n
					}
				}
				self := fmt.Sprintf("%s=%s-%d.%s-headless.%s.svc:9093", id, release, i, release, namespace)
				if slices.Contains(strings.Split(e["STORAGED_RAFT_PEERS"], ","), self) {
					bootstrap = append(bootstrap, i)
				} else {
					joiners = append(joiners, i)
				}
			}
			if !slices.Equal(joiners, tc.joiners) || !slices.Equal(bootstrap, tc.bootstrap) {
				t.Errorf("joining pods %v, bootstrap pods %v; want %v, %v", joiners, bootstrap, tc.joiners, tc.bootstrap)
			}
		})
	}
}

// metricName finds the metric names in a PromQL expression: identifiers of storaged's, gRPC's and
// the Go/process collectors' namespaces (the expressions here name no others).
var metricName = regexp.MustCompile(`\b(storaged|grpc_server|process|go)_[a-z0-9_]+\b`)

// TestMonitoringNamesServedMetrics: every metric an alert or a dashboard panel names is on the
// /metrics page of a real storaged (built from cmd/storaged and started here): standalone, and
// with replication a one-voter group's member (the replication alerts).
func TestMonitoringNamesServedMetrics(t *testing.T) {
	monitoring := []string{"monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true"}
	t.Run("standalone", func(t *testing.T) {
		checkMonitoringNames(t, render(t, monitoring...), scrapeRealServer(t, ""), false)
	})
	t.Run("replication", func(t *testing.T) {
		// Member 1's peer address, and member 2's, a learner that never runs.
		peers := "1=" + proctest.FreeAddr(t) + ",2=" + proctest.FreeAddr(t)
		checkMonitoringNames(t, render(t, group(monitoring...)...), scrapeRealServer(t, "storaged_raft_peer_match_index", "--flush-mode", "sync",
			"--raft-id", "1", "--raft-peers", peers, "--raft-learners", "2"), true)
	})
}

// checkMonitoringNames fails t for each metric an alert or a dashboard panel of o names that is
// not in served. The dashboard's "Replication: " panels (no data standalone) are checked only
// against a group member's (group) and must name storaged_raft_ metrics only.
func checkMonitoringNames(t *testing.T, o *k8scheck.Objects, served map[string]bool, group bool) {
	t.Helper()
	var exprs []string
	for _, g := range o.PrometheusRules[0].Spec.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr.String())
		}
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(o.ConfigMaps[0].Data["storaged.json"]), &dash); err != nil {
		t.Fatal(err)
	}
	replication := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		if strings.HasPrefix(p.Title, "Replication: ") {
			replication++
			for _, tg := range p.Targets {
				for _, n := range metricName.FindAllString(tg.Expr, -1) {
					if !strings.HasPrefix(n, "storaged_raft_") {
						t.Errorf("panel %q names %s, not a replication metric", p.Title, n)
					}
				}
			}
			if !group {
				continue
			}
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	if replication == 0 {
		t.Error("the dashboard has no Replication panels")
	}
	if len(exprs) < 10 {
		t.Fatalf("only %d expressions found", len(exprs))
	}
	for _, e := range exprs {
		names := metricName.FindAllString(e, -1)
		if len(names) == 0 {
			t.Errorf("expression names no known metric: %s", e)
		}
		for _, n := range names {
			if !served[n] {
				t.Errorf("%s is not served by storaged (expression: %s)", n, e)
			}
		}
	}
}

// buildStoraged builds cmd/storaged into a temporary directory and returns the binary.
func buildStoraged(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "storaged")
	build := exec.Command("go", "build", "-o", bin, "./cmd/storaged")
	build.Dir = k8scheck.RepoRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/storaged: %v\n%s", err, out)
	}
	return bin
}

// TestChartEnvNamesFlags: every STORAGED_* variable the chart sets with everything on is the
// environment twin of a flag of the storaged built from this tree (storaged reads only those, and
// ignores any other name without a word: a misspelt or unknown one would silently do nothing).
func TestChartEnvNamesFlags(t *testing.T) {
	o := render(t, group("replicas=5", "replication.join.clusterId="+clusterID, "replication.memberIds.1=101",
		"flush.interval=1s", "flush.syncTimeout=2s")...)
	out, err := exec.Command(buildStoraged(t), "-h").CombinedOutput()
	if err != nil {
		t.Fatalf("storaged -h: %v\n%s", err, out)
	}
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if !flags["raft-peers"] || len(flags) < 20 {
		t.Fatalf("found %d flags in storaged -h: %v", len(flags), flags)
	}
	n := 0
	for _, e := range container(t, o).Env {
		name, ok := strings.CutPrefix(e.Name, "STORAGED_")
		if !ok {
			continue
		}
		n++
		if f := strings.ToLower(strings.ReplaceAll(name, "_", "-")); !flags[f] {
			t.Errorf("env %s: storaged has no flag -%s", e.Name, f)
		}
	}
	if n < 15 {
		t.Errorf("only %d STORAGED_* variables", n)
	}
}

// scrapeRealServer builds cmd/storaged, starts it on loopback ports with a temporary data dir,
// waits for /readyz, and for the metric want unless it is "", and returns the metric names on
// /metrics (histograms with _bucket, _sum and _count).
func scrapeRealServer(t *testing.T, want string, args ...string) map[string]bool {
	t.Helper()
	bin := buildStoraged(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--admin-listen", "",
		"--data-dir", t.TempDir(), "--file-size", "1MiB", "--max-message-size", "64KiB"}, args...)...)
	cmd.Env = []string{"HOME=" + t.TempDir()}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line struct {
				Msg     string `json:"message"`
				Metrics string `json:"metrics"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" {
				addr <- line.Metrics
			}
		}
		io.Copy(io.Discard, stderr)
	}()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case <-ctx.Done():
		t.Fatal("storaged did not log its listening line")
	}
	// Ready (store open, collectors registered): poll /readyz until the deadline.
	for {
		r, err := http.Get(base + "/readyz")
		if err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("storaged never became ready: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	// Until want is served: a group member's per-peer series come once it leads.
	for {
		served := scrape(t, base+"/metrics")
		if !served["storaged_store_writable"] {
			t.Fatalf("no storaged_store_writable among %d names", len(served))
		}
		if want == "" || served[want] {
			return served
		}
		select {
		case <-ctx.Done():
			t.Fatalf("storaged never served %s", want)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// scrape returns the metric names on the /metrics page at url (histograms with _bucket, _sum and
// _count).
func scrape(t *testing.T, url string) map[string]bool {
	t.Helper()
	r, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	served := map[string]bool{}
	for name, f := range families {
		served[name] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				served[name+s] = true
			}
		}
	}
	return served
}
