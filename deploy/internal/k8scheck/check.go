package k8scheck

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Facts of the storaged binary (cmd/storaged flag defaults); keep in sync.
const (
	DefaultGRPCPort        = 9090             // --listen / STORAGED_LISTEN ":9090"
	DefaultMetricsPort     = 9091             // --metrics-listen / STORAGED_METRICS_LISTEN ":9091"
	DefaultShutdownTimeout = 30 * time.Second // --shutdown-timeout / STORAGED_SHUTDOWN_TIMEOUT
)

// Facts of the Dockerfile, cmd/storaged and proto/storaged/v1; keep in sync.
const (
	ContainerDataDir   = "/var/lib/storaged"               // STORAGED_DATA_DIR in the image, VOLUME, mountPath
	NonRootID          = 65532                             // distroless "nonroot" UID and GID
	StoreHealthService = "storaged.v1.MessageStoreService" // SERVING only when recovered and writable
	ContainerName      = "storaged"
	GRPCPortName       = "grpc"
	MetricsPortName    = "metrics"
	ServicePortMetrics = "http-metrics"
	LivezPath          = "/livez"  // server.LivezPath: overall health ("")
	ReadyzPath         = "/readyz" // server.ReadyzPath: StoreHealthService
)

const (
	// Minimum time the startupProbe must tolerate before the kubelet restarts a pod (long commitlog recovery).
	minStartupBudget = 10 * time.Minute
	// Minimum slack, beyond preStop + shutdown timeout, for the final flush + fsync + close.
	minGraceMargin = 5 * time.Second
)

// Problems collects check failures, so one run reports all of them.
type Problems []string

func (p *Problems) Add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

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
func checkListenAddr(p *Problems, env map[string]string, name string, wantPort int32) {
	v, ok := env[name]
	if !ok {
		return // binary default applies
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		p.Add("env %s=%q: %v", name, v, err)
		return
	}
	if port != strconv.Itoa(int(wantPort)) {
		p.Add("env %s=%q: port %s, but the container port is %d", name, v, port, wantPort)
	}
	if host != "" && host != "0.0.0.0" && host != "::" {
		p.Add("env %s=%q: must listen on all interfaces (the kubelet and sidecars connect to the pod IP)", name, v)
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

// checkProbe wants an HTTP GET probe of path on the metrics container port (by name or number).
func checkProbe(p *Problems, kind string, pr *corev1.Probe, c *corev1.Container, metricsPort int32, path string) {
	if pr == nil {
		p.Add("%s: missing", kind)
		return
	}
	h := pr.ProbeHandler
	if h.HTTPGet == nil || h.GRPC != nil || h.TCPSocket != nil || h.Exec != nil {
		p.Add("%s: must be an httpGet probe on the metrics port, and only that (gRPC probes fail under "+
			"Linkerd default-deny and with --tls-cert)", kind)
		return
	}
	g := h.HTTPGet
	port := g.Port.IntVal
	if g.Port.Type == intstr.String {
		port = containerPort(c, g.Port.StrVal)
	}
	if port != metricsPort || port == 0 {
		p.Add("%s: httpGet port %s, want the metrics container port %d", kind, g.Port.String(), metricsPort)
	}
	if g.Path != path {
		p.Add("%s: httpGet path %q, want %q", kind, g.Path, path)
	}
	if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
		p.Add("%s: httpGet scheme %s, want HTTP (the metrics port is plaintext)", kind, g.Scheme)
	}
	if len(g.HTTPHeaders) > 0 || g.Host != "" {
		p.Add("%s: httpGet host/headers set; the endpoints need none", kind)
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

// Check runs every check on the store's workload objects and returns what failed.
func Check(o *Objects) Problems {
	var p Problems
	if len(o.StatefulSets) != 1 {
		p.Add("want exactly 1 StatefulSet, got %d", len(o.StatefulSets))
		return p
	}
	sts := o.StatefulSets[0]
	pod := &sts.Spec.Template.Spec
	podLabels := labels.Set(sts.Spec.Template.Labels)

	// Selector of the StatefulSet.
	if sts.Spec.Selector == nil || len(sts.Spec.Selector.MatchLabels)+len(sts.Spec.Selector.MatchExpressions) == 0 {
		p.Add("StatefulSet: empty selector")
	} else if sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector); err != nil {
		p.Add("StatefulSet: selector: %v", err)
	} else if !sel.Matches(podLabels) {
		p.Add("StatefulSet: selector %s does not match pod template labels %v", sel, podLabels)
	}

	c := findContainer(pod, ContainerName)
	if c == nil {
		p.Add("StatefulSet: no container named %q", ContainerName)
		return p
	}
	env := envValues(c)

	// Ports: the binary's defaults, and the STORAGED_* listen env (if set) agrees with them.
	grpcPort, metricsPort := containerPort(c, GRPCPortName), containerPort(c, MetricsPortName)
	if grpcPort != DefaultGRPCPort {
		p.Add("container port %q = %d, want %d (storaged --listen default)", GRPCPortName, grpcPort, DefaultGRPCPort)
	}
	if metricsPort != DefaultMetricsPort {
		p.Add("container port %q = %d, want %d (storaged --metrics-listen default)", MetricsPortName, metricsPort, DefaultMetricsPort)
	}
	for _, cp := range c.Ports {
		if cp.Protocol != "" && cp.Protocol != corev1.ProtocolTCP {
			p.Add("container port %q: protocol %s, want TCP", cp.Name, cp.Protocol)
		}
	}
	checkListenAddr(&p, env, "STORAGED_LISTEN", grpcPort)
	checkListenAddr(&p, env, "STORAGED_METRICS_LISTEN", metricsPort)
	if v, ok := env["STORAGED_FLUSH_MODE"]; ok && v != "async" && v != "sync" {
		p.Add("env STORAGED_FLUSH_MODE=%q, want async or sync", v)
	}
	if v, ok := env["STORAGED_LOG_FORMAT"]; ok && v != "json" {
		p.Add("env STORAGED_LOG_FORMAT=%q, want json", v)
	}

	// Probes: HTTP on the metrics port; readiness = store writable (/readyz), startup/liveness = process
	// alive (/livez). So the metrics server must be on.
	if v, ok := env["STORAGED_METRICS_LISTEN"]; ok && v == "" {
		p.Add("env STORAGED_METRICS_LISTEN is empty: the metrics server also serves the probes")
	}
	checkProbe(&p, "startupProbe", c.StartupProbe, c, metricsPort, LivezPath)
	checkProbe(&p, "readinessProbe", c.ReadinessProbe, c, metricsPort, ReadyzPath)
	checkProbe(&p, "livenessProbe", c.LivenessProbe, c, metricsPort, LivezPath)
	if c.StartupProbe != nil && probeBudget(c.StartupProbe) < minStartupBudget {
		p.Add("startupProbe: tolerates only %v (periodSeconds x failureThreshold), want >= %v for long recovery",
			probeBudget(c.StartupProbe), minStartupBudget)
	}

	// Shutdown budget: grace period > preStop sleep + STORAGED_SHUTDOWN_TIMEOUT + margin.
	shutdown := DefaultShutdownTimeout
	if v, ok := env["STORAGED_SHUTDOWN_TIMEOUT"]; ok {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			p.Add("env STORAGED_SHUTDOWN_TIMEOUT=%q: not a positive duration", v)
		} else {
			shutdown = d
		}
	}
	var preStop time.Duration
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds <= 0 {
		p.Add("lifecycle.preStop: want a sleep action (no shell in the image)")
	} else {
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	grace := 30 * time.Second // Kubernetes default
	if pod.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	}
	if need := preStop + shutdown + minGraceMargin; grace < need {
		p.Add("terminationGracePeriodSeconds %v < preStop %v + shutdown timeout %v + margin %v", grace, preStop, shutdown, minGraceMargin)
	}

	// Data directory: STORAGED_DATA_DIR is set and is the mount path of a volumeClaimTemplate.
	dataDir, ok := env["STORAGED_DATA_DIR"]
	if !ok || dataDir == "" {
		p.Add("env STORAGED_DATA_DIR must be set (the default ./data is not on the volume)")
	} else if dataDir != ContainerDataDir {
		p.Add("env STORAGED_DATA_DIR=%q, want %q (the image's VOLUME)", dataDir, ContainerDataDir)
	}
	var dataMount *corev1.VolumeMount
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == dataDir {
			dataMount = &c.VolumeMounts[i]
		}
	}
	if dataMount == nil {
		p.Add("no volumeMount at STORAGED_DATA_DIR %q", dataDir)
	} else {
		if dataMount.ReadOnly {
			p.Add("volumeMount %q: must be writable", dataMount.Name)
		}
		var vct *corev1.PersistentVolumeClaim
		for i := range sts.Spec.VolumeClaimTemplates {
			if sts.Spec.VolumeClaimTemplates[i].Name == dataMount.Name {
				vct = &sts.Spec.VolumeClaimTemplates[i]
			}
		}
		if vct == nil {
			p.Add("volumeMount %q at %s: not a volumeClaimTemplate (data would not persist)", dataMount.Name, dataMount.MountPath)
		} else if q, ok := vct.Spec.Resources.Requests[corev1.ResourceStorage]; !ok || q.IsZero() {
			p.Add("volumeClaimTemplate %q: no storage request", vct.Name)
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
		p.Add("pod securityContext.runAsNonRoot must be true")
	}
	if !ptrValue(csc.RunAsNonRoot) {
		p.Add("container securityContext.runAsNonRoot must be true")
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
		if ptrValue(id.v) != NonRootID {
			p.Add("%s = %v, want %d (the image's USER; fsGroup makes the volume writable)", id.name, ptrValue(id.v), NonRootID)
		}
	}
	if !ptrValue(csc.ReadOnlyRootFilesystem) {
		p.Add("container securityContext.readOnlyRootFilesystem must be true")
	}
	if csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
		p.Add("container securityContext.allowPrivilegeEscalation must be false")
	}
	if ptrValue(csc.Privileged) {
		p.Add("container must not be privileged")
	}
	if csc.Capabilities == nil || !slices.Contains(csc.Capabilities.Drop, "ALL") || len(csc.Capabilities.Add) > 0 {
		p.Add("container securityContext.capabilities: want drop [ALL] and nothing added")
	}
	if psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		p.Add("pod securityContext.seccompProfile.type must be RuntimeDefault")
	}
	if csc.SeccompProfile != nil && csc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		p.Add("container securityContext.seccompProfile.type must be RuntimeDefault")
	}
	checkStoreHost(&p, c, grpcPort)

	if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
		p.Add("enableServiceLinks must be false: the Service %q would inject STORAGED_* variables that the binary reads as config", ContainerName)
	}

	// Resources and GOMEMLIMIT below the memory limit.
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := c.Resources.Requests[r]; !ok || q.IsZero() {
			p.Add("resources.requests.%s must be set", r)
		}
	}
	memLimit, hasMemLimit := c.Resources.Limits[corev1.ResourceMemory]
	if !hasMemLimit || memLimit.IsZero() {
		p.Add("resources.limits.memory must be set")
	}
	if v, ok := env["GOMEMLIMIT"]; !ok {
		p.Add("env GOMEMLIMIT must be set (below the memory limit)")
	} else if n, err := parseGoMemLimit(v); err != nil {
		p.Add("env GOMEMLIMIT: %v", err)
	} else if hasMemLimit && resource.NewQuantity(n, resource.BinarySI).Cmp(memLimit) >= 0 {
		p.Add("env GOMEMLIMIT=%s is not below resources.limits.memory %s", v, memLimit.String())
	}

	// Services: selectors match the pods; the grpc port is declared as gRPC and reaches the grpc container port.
	var clusterIP, governing *corev1.Service
	for _, svc := range o.Services {
		if svc.Name == sts.Spec.ServiceName {
			governing = svc
		}
		if !isHeadless(svc) && (svc.Spec.Type == "" || svc.Spec.Type == corev1.ServiceTypeClusterIP) {
			clusterIP = svc
		}
		if len(svc.Spec.Selector) == 0 {
			p.Add("Service %s: empty selector", svc.Name)
		} else if sel := labels.SelectorFromSet(svc.Spec.Selector); !sel.Matches(podLabels) {
			p.Add("Service %s: selector %s does not match pod template labels %v", svc.Name, sel, podLabels)
		}
		if sp := servicePort(svc, GRPCPortName); sp == nil {
			p.Add("Service %s: no port named %q", svc.Name, GRPCPortName)
		} else {
			if ptrValue(sp.AppProtocol) != "grpc" {
				p.Add("Service %s: port %q appProtocol %q, want grpc", svc.Name, sp.Name, ptrValue(sp.AppProtocol))
			}
			if got := resolveTargetPort(*sp, c); got != grpcPort {
				p.Add("Service %s: port %q targets container port %d, want %d", svc.Name, sp.Name, got, grpcPort)
			}
		}
		if sp := servicePort(svc, ServicePortMetrics); sp != nil {
			if got := resolveTargetPort(*sp, c); got != metricsPort {
				p.Add("Service %s: port %q targets container port %d, want %d", svc.Name, sp.Name, got, metricsPort)
			}
		}
	}
	if clusterIP == nil {
		p.Add("no ClusterIP Service for clients")
	} else if servicePort(clusterIP, ServicePortMetrics) == nil {
		p.Add("Service %s: no port named %q", clusterIP.Name, ServicePortMetrics)
	}
	if sts.Spec.ServiceName == "" || governing == nil {
		p.Add("StatefulSet serviceName %q: no such Service", sts.Spec.ServiceName)
	} else if !isHeadless(governing) {
		p.Add("StatefulSet serviceName %q: Service is not headless (clusterIP: None)", governing.Name)
	} else if !governing.Spec.PublishNotReadyAddresses {
		p.Add("headless Service %s: publishNotReadyAddresses must be true (a pod not ready for writes still serves reads)", governing.Name)
	}

	// PodDisruptionBudget.
	if len(o.PDBs) == 0 {
		p.Add("no PodDisruptionBudget")
	}
	for _, pdb := range o.PDBs {
		if (pdb.Spec.MinAvailable == nil) == (pdb.Spec.MaxUnavailable == nil) {
			p.Add("PodDisruptionBudget %s: set exactly one of minAvailable and maxUnavailable", pdb.Name)
		}
		if pdb.Spec.Selector == nil || len(pdb.Spec.Selector.MatchLabels)+len(pdb.Spec.Selector.MatchExpressions) == 0 {
			p.Add("PodDisruptionBudget %s: empty selector", pdb.Name)
		} else if sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil {
			p.Add("PodDisruptionBudget %s: selector: %v", pdb.Name, err)
		} else if !sel.Matches(podLabels) {
			p.Add("PodDisruptionBudget %s: selector %s does not match pod template labels %v", pdb.Name, sel, podLabels)
		}
	}
	return p
}

// checkStoreHost wants STORAGED_STORE_HOST from the pod IP (downward API): "$(POD_IP)", or
// "$(POD_IP):<grpc port>", with POD_IP = status.podIP defined before it (Kubernetes expands
// $(VAR) only from variables listed earlier).
func checkStoreHost(p *Problems, c *corev1.Container, grpcPort int32) {
	podIPVar, hostAt, varAt := "", -1, -1
	for i, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP" && podIPVar == "" {
			podIPVar, varAt = e.Name, i
		}
		if e.Name == "STORAGED_STORE_HOST" {
			hostAt = i
		}
	}
	if podIPVar == "" {
		p.Add("env: no variable from fieldRef status.podIP (the store host every msgId carries)")
		return
	}
	if hostAt < 0 {
		p.Add("env STORAGED_STORE_HOST must be set from $(%s): without it every pod writes 127.0.0.1 into its msgIds", podIPVar)
		return
	}
	v := c.Env[hostAt].Value
	ok := v == "$("+podIPVar+")" || v == fmt.Sprintf("$(%s):%d", podIPVar, grpcPort)
	if !ok {
		p.Add("env STORAGED_STORE_HOST=%q, want $(%s) (or $(%s):%d)", v, podIPVar, podIPVar, grpcPort)
	}
	if varAt > hostAt {
		p.Add("env %s must come before STORAGED_STORE_HOST ($(VAR) expands only earlier variables)", podIPVar)
	}
}
