package deploy_test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// podSpecs returns every pod template of the manifests with where it is.
func podSpecs(t *testing.T, byKind map[string][]map[string]any) map[string]map[string]any {
	t.Helper()
	pods := map[string]map[string]any{}
	for _, d := range byKind["Deployment"] {
		pods[d["_file"].(string)] = mapAt(t, d, "spec", "template", "spec")
	}
	for _, d := range byKind["Job"] {
		pods[d["_file"].(string)] = mapAt(t, d, "spec", "template", "spec")
	}
	for _, d := range byKind["CronJob"] {
		pods[d["_file"].(string)] = mapAt(t, d, "spec", "jobTemplate", "spec", "template", "spec")
	}
	require.Len(t, pods, 3, "the Deployment, the migrate Job and the reaper CronJob")
	return pods
}

func containers(pod map[string]any) []map[string]any {
	var out []map[string]any
	for _, key := range []string{"initContainers", "containers"} {
		cs, _ := pod[key].([]any)
		for _, c := range cs {
			out = append(out, c.(map[string]any))
		}
	}
	return out
}

// mebibytes parses the quantities the manifests use (512Mi, 1Gi, 460MiB).
func mebibytes(t *testing.T, q string) float64 {
	t.Helper()
	m := regexp.MustCompile(`^([0-9.]+)(Mi|MiB|Gi|GiB)$`).FindStringSubmatch(q)
	require.NotNilf(t, m, "quantity %q", q)
	n, err := strconv.ParseFloat(m[1], 64)
	require.NoError(t, err)
	if strings.HasPrefix(m[2], "G") {
		n *= 1024
	}
	return n
}

// pinned is an image named by digest: the placeholder of the examples or a
// real sha256.
var pinned = regexp.MustCompile(`^[a-z0-9.\-/:]+@sha256:(<digest>|[0-9a-f]{64})$`)

func TestImagesArePinnedByDigest(t *testing.T) {
	t.Parallel()
	require.True(t, pinned.MatchString("ghcr.io/telco-platform/coordinator@sha256:<digest>"))
	require.True(t, pinned.MatchString("ghcr.io/x/y:1.2@sha256:"+strings.Repeat("ab", 32)))
	for _, bad := range []string{"ghcr.io/x/y:latest", "ghcr.io/x/y:1.2", "ghcr.io/x/y", "ghcr.io/x/y@sha256:abc"} {
		require.False(t, pinned.MatchString(bad), bad)
	}
	byKind, _ := k8sManifests(t)
	for file, pod := range podSpecs(t, byKind) {
		for _, c := range containers(pod) {
			image, _ := c["image"].(string)
			require.Regexpf(t, pinned, image, "%s: container %v: pin the image by digest (docs/security.md#kubernetes)", file, c["name"])
		}
	}
	// Compose and the Dockerfile build and run locally: tags, but never :latest.
	compose := yamlDocs(t, readFile(t, "compose.yaml"))[0]
	for name, svc := range mapAt(t, compose, "services") {
		image, _ := svc.(map[string]any)["image"].(string)
		require.NotEmptyf(t, image, "compose service %s", name)
		require.Regexpf(t, `:[^:/]+$`, image, "compose service %s: an explicit tag", name)
		require.NotContainsf(t, image, ":latest", "compose service %s", name)
	}
	for _, line := range strings.Split(string(readFile(t, "Dockerfile")), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && strings.EqualFold(f[0], "FROM") {
			require.NotContains(t, f[1], ":latest")
			require.Contains(t, f[1], ":", "FROM %s: an explicit tag", f[1])
		}
	}
}

func TestPodsAreLockedDown(t *testing.T) {
	t.Parallel()
	byKind, _ := k8sManifests(t)
	secretFiles := map[string]bool{}
	for k, v := range mapAt(t, byKind["ConfigMap"][0], "data") {
		if strings.HasSuffix(k, "_FILE") {
			secretFiles[v.(string)] = true
		}
	}
	require.NotEmpty(t, secretFiles)
	for file, pod := range podSpecs(t, byKind) {
		require.Equalf(t, false, pod["automountServiceAccountToken"], "%s: automountServiceAccountToken", file)
		sc := mapAt(t, pod, "securityContext")
		require.Equalf(t, true, sc["runAsNonRoot"], "%s", file)
		require.Equalf(t, "RuntimeDefault", mapAt(t, sc, "seccompProfile")["type"], "%s", file)

		// The Secret comes in as read-only files, never as environment.
		mounts := map[string]bool{}
		var secretVolumes []string
		for _, v := range pod["volumes"].([]any) {
			vol := v.(map[string]any)
			if sec, ok := vol["secret"].(map[string]any); ok {
				require.Equalf(t, "coordinator", sec["secretName"], "%s", file)
				secretVolumes = append(secretVolumes, vol["name"].(string))
			}
		}
		require.NotEmptyf(t, secretVolumes, "%s mounts the Secret", file)
		for _, c := range containers(pod) {
			csc := mapAt(t, c, "securityContext")
			require.Equalf(t, false, csc["allowPrivilegeEscalation"], "%s", file)
			require.Equalf(t, true, csc["readOnlyRootFilesystem"], "%s", file)
			require.Equalf(t, []any{"ALL"}, mapAt(t, csc, "capabilities")["drop"], "%s", file)
			for _, ef := range c["envFrom"].([]any) {
				require.NotContainsf(t, ef, "secretRef", "%s: secrets as files (*_FILE), not environment", file)
			}
			for _, m := range c["volumeMounts"].([]any) {
				vm := m.(map[string]any)
				require.Equalf(t, true, vm["readOnly"], "%s: %v", file, vm["mountPath"])
				mounts[vm["mountPath"].(string)] = true
			}
			files := map[string]bool{}
			for f := range secretFiles {
				files[f] = true
			}
			var gomemlimit string
			for _, e := range c["env"].([]any) {
				ev := e.(map[string]any)
				switch name := ev["name"].(string); {
				case name == "GOMEMLIMIT":
					gomemlimit, _ = ev["value"].(string)
				case strings.HasSuffix(name, "_FILE"):
					files[ev["value"].(string)] = true
				}
			}
			for f := range files {
				under := false
				for m := range mounts {
					under = under || strings.HasPrefix(f, strings.TrimSuffix(m, "/")+"/")
				}
				require.Truef(t, under, "%s: %s is not on a mounted volume", file, f)
			}
			// GOMEMLIMIT below the memory limit, with room for what the GC does not count.
			limit := mebibytes(t, mapAt(t, c, "resources", "limits")["memory"].(string))
			require.NotEmptyf(t, gomemlimit, "%s: GOMEMLIMIT", file)
			soft := mebibytes(t, gomemlimit)
			require.Truef(t, soft < limit && soft >= 0.8*limit, "%s: GOMEMLIMIT %s for a %v Mi limit: 80-99%%", file, gomemlimit, limit)
		}
	}

	ns := byKind["Namespace"][0]
	labels := mapAt(t, ns, "metadata", "labels")
	for _, mode := range []string{"enforce", "audit", "warn"} {
		require.Equal(t, "restricted", labels["pod-security.kubernetes.io/"+mode], mode)
	}
}

func TestTheSecretIsNotInTheKustomization(t *testing.T) {
	t.Parallel()
	byKind, kustomization := k8sManifests(t)
	require.Empty(t, byKind["Secret"], "no Secret manifest: kubectl apply -k would overwrite the real one")
	for _, r := range kustomization["resources"].([]any) {
		require.NotContains(t, strings.ToLower(r.(string)), "secret")
	}
	for _, k := range []string{"secretGenerator"} {
		require.NotContains(t, kustomization, k)
	}
	require.Contains(t, string(readFile(t, "docs/security.md")), "kubectl -n coordinator create secret generic coordinator")
}

func TestNetworkPolicy(t *testing.T) {
	t.Parallel()
	byKind, kustomization := k8sManifests(t)
	require.Contains(t, kustomization["resources"], "networkpolicy.yaml")
	var deny, allow map[string]any
	for _, np := range byKind["NetworkPolicy"] {
		spec := mapAt(t, np, "spec")
		if len(mapAt(t, spec, "podSelector")) == 0 && spec["ingress"] == nil && spec["egress"] == nil {
			deny = spec
		} else {
			allow = spec
		}
	}
	require.NotNil(t, deny, "a default-deny policy for the namespace")
	require.ElementsMatch(t, []any{"Ingress", "Egress"}, deny["policyTypes"])
	require.NotNil(t, allow)
	require.ElementsMatch(t, []any{"Ingress", "Egress"}, allow["policyTypes"])
	dep := byKind["Deployment"][0]
	podLabels := mapAt(t, dep, "spec", "template", "metadata", "labels")
	for k, v := range mapAt(t, allow, "podSelector", "matchLabels") {
		require.Equal(t, v, podLabels[k], "the policy selects the replicas")
	}

	ports := func(rules any) map[int]bool {
		out := map[int]bool{}
		for _, r := range rules.([]any) {
			for _, p := range r.(map[string]any)["ports"].([]any) {
				out[p.(map[string]any)["port"].(int)] = true
			}
		}
		return out
	}
	c := mapAt(t, dep, "spec", "template", "spec")["containers"].([]any)[0].(map[string]any)
	in := ports(allow["ingress"])
	for _, p := range c["ports"].([]any) {
		require.True(t, in[p.(map[string]any)["containerPort"].(int)], "ingress to the HTTP port")
	}
	out := ports(allow["egress"])
	require.True(t, out[53], "DNS")
	cm := mapAt(t, byKind["ConfigMap"][0], "data")
	// portOf: the port of host:port, or of a URL's authority.
	portOf := func(s string) int {
		if _, rest, ok := strings.Cut(s, "://"); ok {
			s = rest[strings.LastIndexByte(rest, '@')+1:]
			s, _, _ = strings.Cut(s, "/")
		}
		n, err := strconv.Atoi(s[strings.LastIndexByte(s, ':')+1:])
		require.NoError(t, err, s)
		return n
	}
	for _, b := range strings.Split(cm["COORDINATOR_KAFKA_BROKERS"].(string), ",") {
		require.Truef(t, out[portOf(b)], "egress to the Kafka brokers (%s)", b)
	}
	require.Truef(t, out[portOf(cm["COORDINATOR_LOCK_REDIS_URL"].(string))], "egress to Redis")
	require.True(t, out[5432], "egress to PostgreSQL")
}

func TestPodMonitorGivesTheAlertsTheirJobLabel(t *testing.T) {
	t.Parallel()
	byKind, kustomization := k8sManifests(t)
	require.Contains(t, kustomization["resources"], "podmonitor.yaml")
	pm := mapAt(t, byKind["PodMonitor"][0], "spec")
	dep := byKind["Deployment"][0]
	podLabels := mapAt(t, dep, "spec", "template", "metadata", "labels")
	for k, v := range mapAt(t, pm, "selector", "matchLabels") {
		require.Equal(t, v, podLabels[k], "the PodMonitor selects the replicas")
	}
	job, ok := podLabels[pm["jobLabel"].(string)].(string)
	require.True(t, ok, "jobLabel %v names a label of the replicas' pods", pm["jobLabel"])

	c := mapAt(t, dep, "spec", "template", "spec")["containers"].([]any)[0].(map[string]any)
	portNames := map[string]bool{}
	for _, p := range c["ports"].([]any) {
		portNames[p.(map[string]any)["name"].(string)] = true
	}
	for _, ep := range pm["podMetricsEndpoints"].([]any) {
		e := ep.(map[string]any)
		require.True(t, portNames[e["port"].(string)], "scrapes a named port of the container")
		require.Equal(t, "/metrics", e["path"])
	}

	// Every job the alerts select on is the one the PodMonitor sets.
	jobs := regexp.MustCompile(`job="([^"]+)"`).FindAllStringSubmatch(string(readFile(t, "deploy/prometheus/alerts.yaml")), -1)
	require.NotEmpty(t, jobs)
	for _, m := range jobs {
		require.Equal(t, job, m[1], "alerts select job=%q; the PodMonitor sets job=%q", m[1], job)
	}
}
