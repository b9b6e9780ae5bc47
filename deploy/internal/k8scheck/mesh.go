package k8scheck

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Mesh says which service mesh the objects are set up for.
type Mesh struct {
	Istio, Linkerd bool
	// Native: the proxy runs as a native sidecar (an init container that
	// outlives the app); otherwise a classic sidecar must be held until the
	// app's drain is over.
	Native bool
}

// Annotations and values the mesh checks look for.
const (
	istioNative        = "sidecar.istio.io/nativeSidecar"
	istioProxyConfig   = "proxy.istio.io/config"
	linkerdInject      = "linkerd.io/inject"
	linkerdWaitBefore  = "config.alpha.linkerd.io/proxy-wait-before-exit-seconds"
	linkerdNativeAlpha = "config.alpha.linkerd.io/proxy-enable-native-sidecar"
	linkerdNativeBeta  = "config.beta.linkerd.io/proxy-enable-native-sidecar"
	linkerdRetryGRPC   = "retry.linkerd.io/grpc"
)

// drainBudget is what storaged needs after SIGTERM (preStop sleep + shutdown
// timeout) and the pod's grace period.
func drainBudget(pod *corev1.PodSpec, c *corev1.Container) (drain, grace time.Duration) {
	shutdown := DefaultShutdownTimeout
	if v, ok := envValues(c)["STORAGED_SHUTDOWN_TIMEOUT"]; ok {
		if d, err := time.ParseDuration(v); err == nil {
			shutdown = d
		}
	}
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		drain = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	grace = 30 * time.Second
	if pod.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	}
	return drain + shutdown, grace
}

// CheckMesh checks the mesh settings of the pod template and the mesh's
// routing objects: proxy lifecycle around storaged's drain, and retries of
// calls through the client Service only on UNAVAILABLE, with no timeouts
// (a put retried or cut on a timeout may already be stored; streams and
// long polls outlast short timeouts).
func CheckMesh(o *Objects, m Mesh) Problems {
	var p Problems
	if len(o.StatefulSets) != 1 {
		p.Add("want exactly 1 StatefulSet, got %d", len(o.StatefulSets))
		return p
	}
	sts := o.StatefulSets[0]
	pod := &sts.Spec.Template.Spec
	c := findContainer(pod, ContainerName)
	if c == nil {
		p.Add("StatefulSet: no container named %q", ContainerName)
		return p
	}
	ann := sts.Spec.Template.Annotations
	drain, grace := drainBudget(pod, c)
	var client *corev1.Service
	for _, s := range o.Services {
		if !isHeadless(s) {
			client = s
		}
	}
	meshKeys := func(prefixes ...string) []string {
		var keys []string
		for k := range ann {
			for _, pre := range prefixes {
				if strings.Contains(k, pre) {
					keys = append(keys, k)
				}
			}
		}
		slices.Sort(keys)
		return keys
	}
	if !m.Istio {
		if k := meshKeys("istio.io"); len(k) > 0 {
			p.Add("pod annotations %v without Istio", k)
		}
		if len(o.VirtualServices)+len(o.DestinationRules) > 0 {
			p.Add("Istio objects without Istio")
		}
	}
	if !m.Linkerd {
		if k := meshKeys("linkerd.io"); len(k) > 0 {
			p.Add("pod annotations %v without Linkerd", k)
		}
		if len(o.GRPCRoutes) > 0 {
			p.Add("GRPCRoute without Linkerd")
		}
	}
	if m.Istio {
		checkIstio(&p, o, ann, m.Native, drain, grace, client)
	}
	if m.Linkerd {
		checkLinkerd(&p, o, ann, m.Native, drain, grace, client)
	}
	return p
}

func checkIstio(p *Problems, o *Objects, ann map[string]string, native bool, drain, grace time.Duration, client *corev1.Service) {
	if native {
		if ann[istioNative] != "true" {
			p.Add("Istio native sidecar: pod annotation %s=%q, want \"true\"", istioNative, ann[istioNative])
		}
	} else {
		var cfg struct {
			Hold  bool   `json:"holdApplicationUntilProxyStarts"`
			Drain string `json:"terminationDrainDuration"`
		}
		if err := json.Unmarshal([]byte(ann[istioProxyConfig]), &cfg); err != nil {
			p.Add("Istio classic sidecar: pod annotation %s=%q: %v", istioProxyConfig, ann[istioProxyConfig], err)
		} else {
			if !cfg.Hold {
				p.Add("Istio classic sidecar: %s must set holdApplicationUntilProxyStarts", istioProxyConfig)
			}
			d, err := time.ParseDuration(cfg.Drain)
			switch {
			case err != nil:
				p.Add("Istio classic sidecar: terminationDrainDuration %q: %v", cfg.Drain, err)
			case d < drain || d >= grace:
				p.Add("Istio classic sidecar: terminationDrainDuration %v, want at least the drain %v (preStop + shutdown timeout) and below the grace period %v (the default 5s cuts the drain, istio#34855)", d, drain, grace)
			}
		}
	}
	if client == nil {
		p.Add("no client Service for the VirtualService")
		return
	}
	if len(o.VirtualServices) != 1 || len(o.DestinationRules) != 1 {
		p.Add("Istio: want 1 VirtualService and 1 DestinationRule, got %d and %d", len(o.VirtualServices), len(o.DestinationRules))
		return
	}
	isClient := func(host string) bool {
		return host == client.Name || strings.HasPrefix(host, client.Name+".")
	}
	vs := o.VirtualServices[0]
	if !slices.ContainsFunc(vs.Spec.GetHosts(), isClient) {
		p.Add("VirtualService %s: hosts %v do not name the Service %s", vs.Name, vs.Spec.GetHosts(), client.Name)
	}
	if len(vs.Spec.GetHttp()) == 0 {
		p.Add("VirtualService %s: no http route (Istio's default retries would apply, cancelled included)", vs.Name)
	}
	for _, r := range vs.Spec.GetHttp() {
		rt := r.GetRetries()
		if rt == nil {
			p.Add("VirtualService %s route %q: no retries block (Istio's default retryOn includes cancelled)", vs.Name, r.GetName())
			continue
		}
		if on := strings.Split(strings.ReplaceAll(rt.GetRetryOn(), " ", ""), ","); rt.GetAttempts() > 0 && !slices.Equal(on, []string{"unavailable"}) {
			p.Add("VirtualService %s route %q: retryOn %q, want exactly \"unavailable\"", vs.Name, r.GetName(), rt.GetRetryOn())
		}
		if rt.GetPerTryTimeout() != nil {
			p.Add("VirtualService %s route %q: perTryTimeout set: a put retried after a timeout may be stored twice", vs.Name, r.GetName())
		}
		if r.GetTimeout() != nil {
			p.Add("VirtualService %s route %q: timeout set: it would cut streams and long polls", vs.Name, r.GetName())
		}
		for _, d := range r.GetRoute() {
			if !isClient(d.GetDestination().GetHost()) || d.GetDestination().GetPort().GetNumber() != DefaultGRPCPort {
				p.Add("VirtualService %s route %q: destination %s:%d, want the Service %s port %d", vs.Name, r.GetName(),
					d.GetDestination().GetHost(), d.GetDestination().GetPort().GetNumber(), client.Name, DefaultGRPCPort)
			}
		}
	}
	dr := o.DestinationRules[0]
	if !isClient(dr.Spec.GetHost()) {
		p.Add("DestinationRule %s: host %q, want the Service %s", dr.Name, dr.Spec.GetHost(), client.Name)
	}
	if mode := dr.Spec.GetTrafficPolicy().GetTls().GetMode().String(); mode != "ISTIO_MUTUAL" {
		p.Add("DestinationRule %s: tls mode %s, want ISTIO_MUTUAL (the sidecar does mTLS, storaged speaks h2c)", dr.Name, mode)
	}
}

func checkLinkerd(p *Problems, o *Objects, ann map[string]string, native bool, drain, grace time.Duration, client *corev1.Service) {
	if ann[linkerdInject] != "enabled" {
		p.Add("Linkerd: pod annotation %s=%q, want enabled", linkerdInject, ann[linkerdInject])
	}
	if native {
		if ann[linkerdNativeBeta] != "true" && ann[linkerdNativeAlpha] != "true" {
			p.Add("Linkerd native sidecar: want pod annotation %s (or %s before 2.19) = \"true\"", linkerdNativeBeta, linkerdNativeAlpha)
		}
	} else {
		n, err := strconv.Atoi(ann[linkerdWaitBefore])
		d := time.Duration(n) * time.Second
		if err != nil || d < drain || d >= grace {
			p.Add("Linkerd classic sidecar: %s=%q, want seconds at least the drain %v (preStop + shutdown timeout) and below the grace period %v",
				linkerdWaitBefore, ann[linkerdWaitBefore], drain, grace)
		}
	}
	if client == nil || len(o.GRPCRoutes) != 1 {
		p.Add("Linkerd: want 1 GRPCRoute for the client Service, got %d", len(o.GRPCRoutes))
		return
	}
	r := o.GRPCRoutes[0]
	if v := r.Annotations[linkerdRetryGRPC]; v != "unavailable" {
		p.Add("GRPCRoute %s: %s=%q, want exactly \"unavailable\"", r.Name, linkerdRetryGRPC, v)
	}
	for k := range r.Annotations {
		if k == "retry.linkerd.io/timeout" || k == "retry.linkerd.io/http" || strings.HasPrefix(k, "timeout.linkerd.io/") {
			p.Add("GRPCRoute %s: annotation %s: no timeouts and no HTTP retries on the store's route", r.Name, k)
		}
	}
	ok := false
	for _, ref := range r.Spec.ParentRefs {
		if ref.Name == "" || string(ref.Name) != client.Name {
			continue
		}
		kind, group := "", ""
		if ref.Kind != nil {
			kind = string(*ref.Kind)
		}
		if ref.Group != nil {
			group = string(*ref.Group)
		}
		ok = kind == "Service" && (group == "core" || group == "") && ref.Port != nil && int32(*ref.Port) == DefaultGRPCPort
	}
	if !ok {
		p.Add("GRPCRoute %s: no parentRef to Service %s port %d (group core)", r.Name, client.Name, DefaultGRPCPort)
	}
}
