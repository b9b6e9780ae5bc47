package kubernetes_test

// Offline validation of the Kubernetes manifests in this directory (no cluster, no schema download):
// every document is decoded strictly into its k8s.io/api type, then checked against the facts of the
// storaged binary and of the Dockerfile. TestManifestChecksCatchMutations proves that each check can fail.

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// keep in sync with cmd/storaged flag defaults
const (
	defaultGRPCPort        = 9090             // --listen / STORAGED_LISTEN ":9090"
	defaultMetricsPort     = 9091             // --metrics-listen / STORAGED_METRICS_LISTEN ":9091"
	defaultShutdownTimeout = 30 * time.Second // --shutdown-timeout / STORAGED_SHUTDOWN_TIMEOUT
)

// keep in sync with the Dockerfile, cmd/storaged and proto/storaged/v1
const (
	containerDataDir   = "/var/lib/storaged"               // STORAGED_DATA_DIR in the image, VOLUME, mountPath
	nonRootID          = 65532                             // distroless "nonroot" UID and GID
	storeHealthService = "storaged.v1.MessageStoreService" // SERVING only when recovered and writable
	containerName      = "storaged"
	grpcPortName       = "grpc"
	metricsPortName    = "metrics"
	servicePortMetrics = "http-metrics"
)

const (
	// Minimum time the startupProbe must tolerate before the kubelet restarts a pod (long commitlog recovery).
	minStartupBudget = 10 * time.Minute
	// Minimum slack, beyond preStop + shutdown timeout, for the final flush + fsync + close.
	minGraceMargin = 5 * time.Second
)

// manifests holds every decoded object of this directory.
type manifests struct {
	statefulSets []*appsv1.StatefulSet
	services     []*corev1.Service
	pdbs         []*policyv1.PodDisruptionBudget
}

func (m *manifests) clone() *manifests {
	c := &manifests{}
	for _, s := range m.statefulSets {
		c.statefulSets = append(c.statefulSets, s.DeepCopy())
	}
	for _, s := range m.services {
		c.services = append(c.services, s.DeepCopy())
	}
	for _, p := range m.pdbs {
		c.pdbs = append(c.pdbs, p.DeepCopy())
	}
	return c
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?$`)

// decodeFile splits a YAML stream on "---" lines and strictly decodes every non-empty document.
func decodeFile(name string, data []byte, m *manifests) error {
	for i, doc := range docSeparator.Split(string(data), -1) {
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			return fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		if t := bytes.TrimSpace(j); len(t) == 0 || string(t) == "null" {
			continue // only comments or blank
		}
		if err := decodeDocument([]byte(doc), m); err != nil {
			return fmt.Errorf("%s: document %d: %w", name, i, err)
		}
	}
	return nil
}

// decodeDocument picks the k8s.io/api type by kind and decodes strictly: unknown or duplicate fields fail.
func decodeDocument(doc []byte, m *manifests) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	type kindKey struct{ apiVersion, kind string }
	var obj any
	switch (kindKey{tm.APIVersion, tm.Kind}) {
	case kindKey{"apps/v1", "StatefulSet"}:
		s := &appsv1.StatefulSet{}
		m.statefulSets, obj = append(m.statefulSets, s), s
	case kindKey{"v1", "Service"}:
		s := &corev1.Service{}
		m.services, obj = append(m.services, s), s
	case kindKey{"policy/v1", "PodDisruptionBudget"}:
		p := &policyv1.PodDisruptionBudget{}
		m.pdbs, obj = append(m.pdbs, p), p
	default:
		return fmt.Errorf("unexpected apiVersion %q kind %q (add it to decodeDocument with its checks)", tm.APIVersion, tm.Kind)
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return err
	}
	// yaml.UnmarshalStrict goes through encoding/json, which matches field names case-insensitively
	// ("clusterIp" fills ClusterIP). The API server does not: decode again the way it does.
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strictErrs, err := sigsjson.UnmarshalStrict(j, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

// manifestFiles lists the YAML files of this directory, kustomization.yaml excluded.
func manifestFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, pattern := range []string{"*.yaml", "*.yml"} {
		matches, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, matches...)
	}
	files = slices.DeleteFunc(files, func(f string) bool { return f == "kustomization.yaml" || f == "kustomization.yml" })
	if len(files) == 0 {
		t.Fatal("no manifests found")
	}
	slices.Sort(files)
	return files
}

func loadManifests(t *testing.T) *manifests {
	t.Helper()
	m := &manifests{}
	for _, f := range manifestFiles(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := decodeFile(f, data, m); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// problems collects check failures, so one run reports all of them.
type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

func findContainer(spec *corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

func containerPort(c *corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

// envValues returns the literal env values of c (valueFrom entries map to "").
func envValues(c *corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	return env
}

// checkListenAddr checks that a STORAGED_*LISTEN value listens on all interfaces on the expected port.
func checkListenAddr(p *problems, env map[string]string, name string, wantPort int32) {
	v, ok := env[name]
	if !ok {
		return // binary default applies
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		p.add("env %s=%q: %v", name, v, err)
		return
	}
	if port != strconv.Itoa(int(wantPort)) {
		p.add("env %s=%q: port %s, but the container port is %d", name, v, port, wantPort)
	}
	if host != "" && host != "0.0.0.0" && host != "::" {
		p.add("env %s=%q: must listen on all interfaces (the kubelet and sidecars connect to the pod IP)", name, v)
	}
}

// parseGoMemLimit parses a GOMEMLIMIT value (bytes with an optional B/KiB/MiB/GiB/TiB suffix).
func parseGoMemLimit(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("invalid GOMEMLIMIT %q", s)
	}
	return n * mult, nil
}

func probeBudget(pr *corev1.Probe) time.Duration {
	period, failures := pr.PeriodSeconds, pr.FailureThreshold
	if period == 0 {
		period = 10 // Kubernetes default
	}
	if failures == 0 {
		failures = 3 // Kubernetes default
	}
	return time.Duration(period) * time.Duration(failures) * time.Second
}

func checkProbe(p *problems, kind string, pr *corev1.Probe, grpcPort int32, wantService string) {
	if pr == nil {
		p.add("%s: missing", kind)
		return
	}
	h := pr.ProbeHandler
	if h.GRPC == nil || h.HTTPGet != nil || h.TCPSocket != nil || h.Exec != nil {
		p.add("%s: must be a native grpc probe (grpc.health.v1), and only that", kind)
		return
	}
	if h.GRPC.Port != grpcPort {
		p.add("%s: grpc port %d, want the grpc container port %d", kind, h.GRPC.Port, grpcPort)
	}
	if got := ptrValue(h.GRPC.Service); got != wantService {
		p.add("%s: grpc health service %q, want %q", kind, got, wantService)
	}
}

func ptrValue[T any](v *T) T {
	if v == nil {
		var zero T
		return zero
	}
	return *v
}

// resolveTargetPort returns the container port a Service port forwards to.
func resolveTargetPort(sp corev1.ServicePort, c *corev1.Container) int32 {
	switch {
	case sp.TargetPort.Type == intstr.String && sp.TargetPort.StrVal != "":
		return containerPort(c, sp.TargetPort.StrVal)
	case sp.TargetPort.IntVal != 0:
		return sp.TargetPort.IntVal
	default:
		return sp.Port // targetPort defaults to port
	}
}

func servicePort(svc *corev1.Service, name string) *corev1.ServicePort {
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Name == name {
			return &svc.Spec.Ports[i]
		}
	}
	return nil
}

func isHeadless(svc *corev1.Service) bool { return svc.Spec.ClusterIP == corev1.ClusterIPNone }

// checkManifests runs every check and returns what failed.
func checkManifests(m *manifests) problems {
	var p problems
	if len(m.statefulSets) != 1 {
		p.add("want exactly 1 StatefulSet, got %d", len(m.statefulSets))
		return p
	}
	sts := m.statefulSets[0]
	pod := &sts.Spec.Template.Spec
	podLabels := labels.Set(sts.Spec.Template.Labels)

	// Selector of the StatefulSet.
	if sts.Spec.Selector == nil || len(sts.Spec.Selector.MatchLabels)+len(sts.Spec.Selector.MatchExpressions) == 0 {
		p.add("StatefulSet: empty selector")
	} else if sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector); err != nil {
		p.add("StatefulSet: selector: %v", err)
	} else if !sel.Matches(podLabels) {
		p.add("StatefulSet: selector %s does not match pod template labels %v", sel, podLabels)
	}

	c := findContainer(pod, containerName)
	if c == nil {
		p.add("StatefulSet: no container named %q", containerName)
		return p
	}
	env := envValues(c)

	// Ports: the binary's defaults, and the STORAGED_* listen env (if set) agrees with them.
	grpcPort, metricsPort := containerPort(c, grpcPortName), containerPort(c, metricsPortName)
	if grpcPort != defaultGRPCPort {
		p.add("container port %q = %d, want %d (storaged --listen default)", grpcPortName, grpcPort, defaultGRPCPort)
	}
	if metricsPort != defaultMetricsPort {
		p.add("container port %q = %d, want %d (storaged --metrics-listen default)", metricsPortName, metricsPort, defaultMetricsPort)
	}
	for _, cp := range c.Ports {
		if cp.Protocol != "" && cp.Protocol != corev1.ProtocolTCP {
			p.add("container port %q: protocol %s, want TCP", cp.Name, cp.Protocol)
		}
	}
	checkListenAddr(&p, env, "STORAGED_LISTEN", grpcPort)
	checkListenAddr(&p, env, "STORAGED_METRICS_LISTEN", metricsPort)
	if v, ok := env["STORAGED_FLUSH_MODE"]; ok && v != "async" && v != "sync" {
		p.add("env STORAGED_FLUSH_MODE=%q, want async or sync", v)
	}
	if v, ok := env["STORAGED_LOG_FORMAT"]; ok && v != "json" {
		p.add("env STORAGED_LOG_FORMAT=%q, want json", v)
	}

	// Probes: native gRPC on the grpc port; readiness = store writable, startup/liveness = process alive ("").
	checkProbe(&p, "startupProbe", c.StartupProbe, grpcPort, "")
	checkProbe(&p, "readinessProbe", c.ReadinessProbe, grpcPort, storeHealthService)
	checkProbe(&p, "livenessProbe", c.LivenessProbe, grpcPort, "")
	if c.StartupProbe != nil && probeBudget(c.StartupProbe) < minStartupBudget {
		p.add("startupProbe: tolerates only %v (periodSeconds x failureThreshold), want >= %v for long recovery",
			probeBudget(c.StartupProbe), minStartupBudget)
	}

	// Shutdown budget: grace period > preStop sleep + STORAGED_SHUTDOWN_TIMEOUT + margin.
	shutdown := defaultShutdownTimeout
	if v, ok := env["STORAGED_SHUTDOWN_TIMEOUT"]; ok {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			p.add("env STORAGED_SHUTDOWN_TIMEOUT=%q: not a positive duration", v)
		} else {
			shutdown = d
		}
	}
	var preStop time.Duration
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds <= 0 {
		p.add("lifecycle.preStop: want a sleep action (no shell in the image)")
	} else {
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	grace := 30 * time.Second // Kubernetes default
	if pod.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	}
	if need := preStop + shutdown + minGraceMargin; grace < need {
		p.add("terminationGracePeriodSeconds %v < preStop %v + shutdown timeout %v + margin %v", grace, preStop, shutdown, minGraceMargin)
	}

	// Data directory: STORAGED_DATA_DIR is set and is the mount path of a volumeClaimTemplate.
	dataDir, ok := env["STORAGED_DATA_DIR"]
	if !ok || dataDir == "" {
		p.add("env STORAGED_DATA_DIR must be set (the default ./data is not on the volume)")
	} else if dataDir != containerDataDir {
		p.add("env STORAGED_DATA_DIR=%q, want %q (the image's VOLUME)", dataDir, containerDataDir)
	}
	var dataMount *corev1.VolumeMount
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == dataDir {
			dataMount = &c.VolumeMounts[i]
		}
	}
	if dataMount == nil {
		p.add("no volumeMount at STORAGED_DATA_DIR %q", dataDir)
	} else {
		if dataMount.ReadOnly {
			p.add("volumeMount %q: must be writable", dataMount.Name)
		}
		var vct *corev1.PersistentVolumeClaim
		for i := range sts.Spec.VolumeClaimTemplates {
			if sts.Spec.VolumeClaimTemplates[i].Name == dataMount.Name {
				vct = &sts.Spec.VolumeClaimTemplates[i]
			}
		}
		if vct == nil {
			p.add("volumeMount %q at %s: not a volumeClaimTemplate (data would not persist)", dataMount.Name, dataMount.MountPath)
		} else if q, ok := vct.Spec.Resources.Requests[corev1.ResourceStorage]; !ok || q.IsZero() {
			p.add("volumeClaimTemplate %q: no storage request", vct.Name)
		}
	}

	// Security context.
	psc := pod.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	csc := c.SecurityContext
	if csc == nil {
		csc = &corev1.SecurityContext{}
	}
	if !ptrValue(psc.RunAsNonRoot) {
		p.add("pod securityContext.runAsNonRoot must be true")
	}
	if !ptrValue(csc.RunAsNonRoot) {
		p.add("container securityContext.runAsNonRoot must be true")
	}
	for _, id := range []struct {
		name string
		v    *int64
	}{
		{"pod runAsUser", psc.RunAsUser}, {"pod runAsGroup", psc.RunAsGroup}, {"pod fsGroup", psc.FSGroup},
		{"container runAsUser", csc.RunAsUser}, {"container runAsGroup", csc.RunAsGroup},
	} {
		if id.v == nil && strings.HasPrefix(id.name, "container") {
			continue // inherited from the pod
		}
		if ptrValue(id.v) != nonRootID {
			p.add("%s = %v, want %d (the image's USER; fsGroup makes the volume writable)", id.name, ptrValue(id.v), nonRootID)
		}
	}
	if !ptrValue(csc.ReadOnlyRootFilesystem) {
		p.add("container securityContext.readOnlyRootFilesystem must be true")
	}
	if csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
		p.add("container securityContext.allowPrivilegeEscalation must be false")
	}
	if ptrValue(csc.Privileged) {
		p.add("container must not be privileged")
	}
	if csc.Capabilities == nil || !slices.Contains(csc.Capabilities.Drop, "ALL") || len(csc.Capabilities.Add) > 0 {
		p.add("container securityContext.capabilities: want drop [ALL] and nothing added")
	}
	if psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		p.add("pod securityContext.seccompProfile.type must be RuntimeDefault")
	}
	if csc.SeccompProfile != nil && csc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		p.add("container securityContext.seccompProfile.type must be RuntimeDefault")
	}
	if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
		p.add("enableServiceLinks must be false: the Service %q would inject STORAGED_* variables that the binary reads as config", containerName)
	}

	// Resources and GOMEMLIMIT below the memory limit.
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := c.Resources.Requests[r]; !ok || q.IsZero() {
			p.add("resources.requests.%s must be set", r)
		}
	}
	memLimit, hasMemLimit := c.Resources.Limits[corev1.ResourceMemory]
	if !hasMemLimit || memLimit.IsZero() {
		p.add("resources.limits.memory must be set")
	}
	if v, ok := env["GOMEMLIMIT"]; !ok {
		p.add("env GOMEMLIMIT must be set (below the memory limit)")
	} else if n, err := parseGoMemLimit(v); err != nil {
		p.add("env GOMEMLIMIT: %v", err)
	} else if hasMemLimit && resource.NewQuantity(n, resource.BinarySI).Cmp(memLimit) >= 0 {
		p.add("env GOMEMLIMIT=%s is not below resources.limits.memory %s", v, memLimit.String())
	}

	// Services: selectors match the pods; the grpc port is declared as gRPC and reaches the grpc container port.
	var clusterIP, governing *corev1.Service
	for _, svc := range m.services {
		if svc.Name == sts.Spec.ServiceName {
			governing = svc
		}
		if !isHeadless(svc) && (svc.Spec.Type == "" || svc.Spec.Type == corev1.ServiceTypeClusterIP) {
			clusterIP = svc
		}
		if len(svc.Spec.Selector) == 0 {
			p.add("Service %s: empty selector", svc.Name)
		} else if sel := labels.SelectorFromSet(svc.Spec.Selector); !sel.Matches(podLabels) {
			p.add("Service %s: selector %s does not match pod template labels %v", svc.Name, sel, podLabels)
		}
		if sp := servicePort(svc, grpcPortName); sp == nil {
			p.add("Service %s: no port named %q", svc.Name, grpcPortName)
		} else {
			if ptrValue(sp.AppProtocol) != "grpc" {
				p.add("Service %s: port %q appProtocol %q, want grpc", svc.Name, sp.Name, ptrValue(sp.AppProtocol))
			}
			if got := resolveTargetPort(*sp, c); got != grpcPort {
				p.add("Service %s: port %q targets container port %d, want %d", svc.Name, sp.Name, got, grpcPort)
			}
		}
		if sp := servicePort(svc, servicePortMetrics); sp != nil {
			if got := resolveTargetPort(*sp, c); got != metricsPort {
				p.add("Service %s: port %q targets container port %d, want %d", svc.Name, sp.Name, got, metricsPort)
			}
		}
	}
	if clusterIP == nil {
		p.add("no ClusterIP Service for clients")
	} else if servicePort(clusterIP, servicePortMetrics) == nil {
		p.add("Service %s: no port named %q", clusterIP.Name, servicePortMetrics)
	}
	if sts.Spec.ServiceName == "" || governing == nil {
		p.add("StatefulSet serviceName %q: no such Service", sts.Spec.ServiceName)
	} else if !isHeadless(governing) {
		p.add("StatefulSet serviceName %q: Service is not headless (clusterIP: None)", governing.Name)
	}

	// PodDisruptionBudget.
	if len(m.pdbs) == 0 {
		p.add("no PodDisruptionBudget")
	}
	for _, pdb := range m.pdbs {
		if (pdb.Spec.MinAvailable == nil) == (pdb.Spec.MaxUnavailable == nil) {
			p.add("PodDisruptionBudget %s: set exactly one of minAvailable and maxUnavailable", pdb.Name)
		}
		if pdb.Spec.Selector == nil || len(pdb.Spec.Selector.MatchLabels)+len(pdb.Spec.Selector.MatchExpressions) == 0 {
			p.add("PodDisruptionBudget %s: empty selector", pdb.Name)
		} else if sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil {
			p.add("PodDisruptionBudget %s: selector: %v", pdb.Name, err)
		} else if !sel.Matches(podLabels) {
			p.add("PodDisruptionBudget %s: selector %s does not match pod template labels %v", pdb.Name, sel, podLabels)
		}
	}
	return p
}

func TestManifests(t *testing.T) {
	for _, problem := range checkManifests(loadManifests(t)) {
		t.Error(problem)
	}
}

// TestKustomizationListsManifests keeps kustomization.yaml complete: every manifest file is a resource.
func TestKustomizationListsManifests(t *testing.T) {
	data, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("kustomization.yaml: apiVersion %q kind %q", k.APIVersion, k.Kind)
	}
	files := manifestFiles(t)
	for _, f := range files {
		if !slices.Contains(k.Resources, f) {
			t.Errorf("kustomization.yaml: resources does not list %s", f)
		}
	}
	for _, r := range k.Resources {
		if !slices.Contains(files, r) {
			t.Errorf("kustomization.yaml: resource %s is not a manifest file here", r)
		}
	}
}

// TestStrictDecodeRejects proves that the decoder fails on unknown fields, duplicate fields and unknown kinds.
func TestStrictDecodeRejects(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":      "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {clusterAddress: None}\n",
		"field name case":    "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {clusterIp: None}\n",
		"misplaced field":    "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: x}\nspec: {template: {spec: {containers: [{name: c, readinessProbe: {grpc: {port: 1}, service: x}}]}}}\n",
		"duplicate field":    "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: x}\nspec: {maxUnavailable: 1, maxUnavailable: 2}\n",
		"unknown kind":       "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
		"wrong apiVersion":   "apiVersion: policy/v1beta1\nkind: PodDisruptionBudget\nmetadata: {name: x}\n",
		"missing kind":       "apiVersion: v1\nmetadata: {name: x}\n",
		"bad second doc":     "apiVersion: v1\nkind: Service\nmetadata: {name: x}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: y, lables: {}}\n",
		"wrong value type":   "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: grpc}]}\n",
		"invalid yaml":       "apiVersion: v1\nkind: Service\n  metadata: [\n",
		"string for integer": "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: x}\nspec: {replicas: \"1\"}\n",
	} {
		t.Run(name, func(t *testing.T) {
			if err := decodeFile(name, []byte(doc), &manifests{}); err == nil {
				t.Errorf("decoded without error:\n%s", doc)
			}
		})
	}
	t.Run("comments and empty documents are skipped", func(t *testing.T) {
		m := &manifests{}
		doc := "# header\n---\n\n--- # note\napiVersion: v1\nkind: Service\nmetadata: {name: x}\n---\n"
		if err := decodeFile("ok", []byte(doc), m); err != nil || len(m.services) != 1 {
			t.Errorf("err=%v services=%d, want nil and 1", err, len(m.services))
		}
	})
}

// TestManifestChecksCatchMutations proves that each check fails on a manifest that breaks it.
func TestManifestChecksCatchMutations(t *testing.T) {
	base := loadManifests(t)
	if p := checkManifests(base); len(p) != 0 {
		t.Fatalf("the manifests themselves fail: %v", p)
	}
	sts := func(m *manifests) *appsv1.StatefulSet { return m.statefulSets[0] }
	pod := func(m *manifests) *corev1.PodSpec { return &sts(m).Spec.Template.Spec }
	ctr := func(m *manifests) *corev1.Container { return findContainer(pod(m), containerName) }
	setEnv := func(m *manifests, name, value string) {
		c := ctr(m)
		for i := range c.Env {
			if c.Env[i].Name == name {
				c.Env[i].Value = value
				return
			}
		}
		c.Env = append(c.Env, corev1.EnvVar{Name: name, Value: value})
	}
	delEnv := func(m *manifests, name string) {
		c := ctr(m)
		c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
	}
	setPort := func(m *manifests, name string, port int32) {
		c := ctr(m)
		for i := range c.Ports {
			if c.Ports[i].Name == name {
				c.Ports[i].ContainerPort = port
			}
		}
	}
	svc := func(m *manifests, headless bool) *corev1.Service {
		for _, s := range m.services {
			if isHeadless(s) == headless {
				return s
			}
		}
		t.Fatalf("no Service with headless=%v", headless)
		return nil
	}
	svcPort := func(m *manifests, headless bool, name string) *corev1.ServicePort {
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
		mutate func(m *manifests)
		want   string
	}{
		{"no StatefulSet", func(m *manifests) { m.statefulSets = nil }, "exactly 1 StatefulSet"},
		{"sts selector mismatch", func(m *manifests) { sts(m).Spec.Selector.MatchLabels["app.kubernetes.io/name"] = "other" }, "StatefulSet: selector"},
		{"sts selector empty", func(m *manifests) { sts(m).Spec.Selector = &metav1.LabelSelector{} }, "StatefulSet: empty selector"},
		{"container renamed", func(m *manifests) { ctr(m).Name = "app" }, "no container named"},
		{"grpc port", func(m *manifests) { setPort(m, grpcPortName, 8080) }, `container port "grpc"`},
		{"metrics port", func(m *manifests) { setPort(m, metricsPortName, 8081) }, `container port "metrics"`},
		{"udp port", func(m *manifests) { ctr(m).Ports[0].Protocol = corev1.ProtocolUDP }, "want TCP"},
		{"listen env port", func(m *manifests) { setEnv(m, "STORAGED_LISTEN", ":9999") }, "STORAGED_LISTEN"},
		{"listen env loopback", func(m *manifests) { setEnv(m, "STORAGED_LISTEN", "127.0.0.1:9090") }, "all interfaces"},
		{"metrics env port", func(m *manifests) { setEnv(m, "STORAGED_METRICS_LISTEN", ":9999") }, "STORAGED_METRICS_LISTEN"},
		{"flush mode", func(m *manifests) { setEnv(m, "STORAGED_FLUSH_MODE", "never") }, "STORAGED_FLUSH_MODE"},
		{"log format", func(m *manifests) { setEnv(m, "STORAGED_LOG_FORMAT", "text") }, "STORAGED_LOG_FORMAT"},
		{"no startup probe", func(m *manifests) { ctr(m).StartupProbe = nil }, "startupProbe: missing"},
		{"tcp readiness", func(m *manifests) {
			ctr(m).ReadinessProbe.ProbeHandler = corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(9090)}}
		}, "readinessProbe: must be a native grpc probe"},
		{"liveness wrong port", func(m *manifests) { ctr(m).LivenessProbe.GRPC.Port = 9091 }, "livenessProbe: grpc port"},
		{"readiness overall only", func(m *manifests) { ctr(m).ReadinessProbe.GRPC.Service = nil }, "readinessProbe: grpc health service"},
		{"liveness on store service", func(m *manifests) {
			s := storeHealthService
			ctr(m).LivenessProbe.GRPC.Service = &s
		}, "livenessProbe: grpc health service"},
		{"startup budget short", func(m *manifests) { ctr(m).StartupProbe.FailureThreshold = 3 }, "startupProbe: tolerates only"},
		{"no preStop", func(m *manifests) { ctr(m).Lifecycle = nil }, "lifecycle.preStop"},
		{"grace too short", func(m *manifests) { pod(m).TerminationGracePeriodSeconds = i64(45) }, "terminationGracePeriodSeconds"},
		{"grace default", func(m *manifests) { pod(m).TerminationGracePeriodSeconds = nil }, "terminationGracePeriodSeconds"},
		{"shutdown timeout longer", func(m *manifests) { setEnv(m, "STORAGED_SHUTDOWN_TIMEOUT", "2m") }, "terminationGracePeriodSeconds"},
		{"shutdown timeout invalid", func(m *manifests) { setEnv(m, "STORAGED_SHUTDOWN_TIMEOUT", "40") }, "STORAGED_SHUTDOWN_TIMEOUT"},
		{"no data dir env", func(m *manifests) { delEnv(m, "STORAGED_DATA_DIR") }, "STORAGED_DATA_DIR must be set"},
		{"data dir env elsewhere", func(m *manifests) { setEnv(m, "STORAGED_DATA_DIR", "/data") }, "STORAGED_DATA_DIR"},
		{"mount path differs", func(m *manifests) { ctr(m).VolumeMounts[0].MountPath = "/data" }, "no volumeMount at STORAGED_DATA_DIR"},
		{"mount read-only", func(m *manifests) { ctr(m).VolumeMounts[0].ReadOnly = true }, "must be writable"},
		{"mount not a claim", func(m *manifests) { sts(m).Spec.VolumeClaimTemplates[0].Name = "other" }, "not a volumeClaimTemplate"},
		{"claim without size", func(m *manifests) { sts(m).Spec.VolumeClaimTemplates[0].Spec.Resources.Requests = nil }, "no storage request"},
		{"pod runAsNonRoot", func(m *manifests) { pod(m).SecurityContext.RunAsNonRoot = nil }, "pod securityContext.runAsNonRoot"},
		{"container runAsNonRoot", func(m *manifests) { ctr(m).SecurityContext.RunAsNonRoot = ptr(false) }, "container securityContext.runAsNonRoot"},
		{"pod runAsUser root", func(m *manifests) { pod(m).SecurityContext.RunAsUser = i64(0) }, "pod runAsUser"},
		{"pod runAsGroup", func(m *manifests) { pod(m).SecurityContext.RunAsGroup = i64(1000) }, "pod runAsGroup"},
		{"no fsGroup", func(m *manifests) { pod(m).SecurityContext.FSGroup = nil }, "pod fsGroup"},
		{"container runAsUser", func(m *manifests) { ctr(m).SecurityContext.RunAsUser = i64(1000) }, "container runAsUser"},
		{"container runAsGroup", func(m *manifests) { ctr(m).SecurityContext.RunAsGroup = i64(0) }, "container runAsGroup"},
		{"writable root fs", func(m *manifests) { ctr(m).SecurityContext.ReadOnlyRootFilesystem = nil }, "readOnlyRootFilesystem"},
		{"privilege escalation", func(m *manifests) { ctr(m).SecurityContext.AllowPrivilegeEscalation = ptr(true) }, "allowPrivilegeEscalation"},
		{"privileged", func(m *manifests) { ctr(m).SecurityContext.Privileged = ptr(true) }, "privileged"},
		{"caps not dropped", func(m *manifests) { ctr(m).SecurityContext.Capabilities.Drop = []corev1.Capability{"NET_RAW"} }, "capabilities"},
		{"caps added", func(m *manifests) { ctr(m).SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_ADMIN"} }, "capabilities"},
		{"pod seccomp", func(m *manifests) { pod(m).SecurityContext.SeccompProfile = nil }, "pod securityContext.seccompProfile"},
		{"container seccomp", func(m *manifests) {
			ctr(m).SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		}, "container securityContext.seccompProfile"},
		{"service links", func(m *manifests) { pod(m).EnableServiceLinks = nil }, "enableServiceLinks"},
		{"no cpu request", func(m *manifests) { delete(ctr(m).Resources.Requests, corev1.ResourceCPU) }, "requests.cpu"},
		{"no memory request", func(m *manifests) { delete(ctr(m).Resources.Requests, corev1.ResourceMemory) }, "requests.memory"},
		{"no memory limit", func(m *manifests) { ctr(m).Resources.Limits = nil }, "limits.memory"},
		{"no GOMEMLIMIT", func(m *manifests) { delEnv(m, "GOMEMLIMIT") }, "GOMEMLIMIT must be set"},
		{"GOMEMLIMIT invalid", func(m *manifests) { setEnv(m, "GOMEMLIMIT", "1.5GB") }, "invalid GOMEMLIMIT"},
		{"GOMEMLIMIT at limit", func(m *manifests) { setEnv(m, "GOMEMLIMIT", "2GiB") }, "not below"},
		{"service selector mismatch", func(m *manifests) { svc(m, false).Spec.Selector["app.kubernetes.io/name"] = "other" }, "does not match pod template labels"},
		{"service selector empty", func(m *manifests) { svc(m, true).Spec.Selector = nil }, "empty selector"},
		{"grpc port renamed", func(m *manifests) { svcPort(m, false, grpcPortName).Name = "tcp" }, `no port named "grpc"`},
		{"grpc appProtocol", func(m *manifests) { svcPort(m, false, grpcPortName).AppProtocol = nil }, "appProtocol"},
		{"headless appProtocol", func(m *manifests) {
			h := "http"
			svcPort(m, true, grpcPortName).AppProtocol = &h
		}, "appProtocol"},
		{"grpc targets metrics", func(m *manifests) { svcPort(m, false, grpcPortName).TargetPort = intstr.FromString(metricsPortName) }, "targets container port"},
		{"grpc targets wrong number", func(m *manifests) { svcPort(m, true, grpcPortName).TargetPort = intstr.FromInt32(8080) }, "targets container port"},
		{"grpc target unknown name", func(m *manifests) { svcPort(m, false, grpcPortName).TargetPort = intstr.FromString("gprc") }, "targets container port"},
		{"metrics target", func(m *manifests) { svcPort(m, false, servicePortMetrics).TargetPort = intstr.FromInt32(9090) }, `"http-metrics" targets`},
		{"no metrics service port", func(m *manifests) {
			s := svc(m, false)
			s.Spec.Ports = slices.DeleteFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == servicePortMetrics })
		}, `no port named "http-metrics"`},
		{"no ClusterIP service", func(m *manifests) { svc(m, false).Spec.Type = corev1.ServiceTypeNodePort }, "no ClusterIP Service"},
		{"serviceName unknown", func(m *manifests) { sts(m).Spec.ServiceName = "nope" }, "no such Service"},
		{"serviceName not headless", func(m *manifests) { sts(m).Spec.ServiceName = svc(m, false).Name }, "not headless"},
		{"governing service given a cluster IP", func(m *manifests) {
			h := svc(m, true)
			h.Spec.ClusterIP = ""
			sts(m).Spec.ServiceName = h.Name
		}, "not headless"},
		{"no PDB", func(m *manifests) { m.pdbs = nil }, "no PodDisruptionBudget"},
		{"PDB selector mismatch", func(m *manifests) { m.pdbs[0].Spec.Selector.MatchLabels["app.kubernetes.io/component"] = "x" }, "PodDisruptionBudget storaged: selector"},
		{"PDB selector empty", func(m *manifests) { m.pdbs[0].Spec.Selector = nil }, "PodDisruptionBudget storaged: empty selector"},
		{"PDB no budget", func(m *manifests) { m.pdbs[0].Spec.MaxUnavailable = nil }, "exactly one of minAvailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := base.clone()
			tc.mutate(m)
			p := checkManifests(m)
			if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("want a problem containing %q, got %q", tc.want, p)
			}
		})
	}
}
