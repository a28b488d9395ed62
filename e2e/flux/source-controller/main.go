// source-controller with its GitRepository reconciler alone: the only source modelpool's
// e2e tests use. Upstream's main (v1.9.6) also runs the Helm, OCI and bucket reconcilers,
// which link Helm, cosign and the cloud SDKs; the flags, the manager, the storage and the
// artifact server are upstream's.
package main

import (
	"fmt"
	"os"
	"time"

	flag "github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	ctrlcfg "sigs.k8s.io/controller-runtime/pkg/config"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	artcfg "github.com/fluxcd/pkg/artifact/config"
	artdigest "github.com/fluxcd/pkg/artifact/digest"
	artsrv "github.com/fluxcd/pkg/artifact/server"
	artstore "github.com/fluxcd/pkg/artifact/storage"
	"github.com/fluxcd/pkg/auth"
	pkgcache "github.com/fluxcd/pkg/cache"
	"github.com/fluxcd/pkg/git"
	"github.com/fluxcd/pkg/runtime/client"
	helper "github.com/fluxcd/pkg/runtime/controller"
	"github.com/fluxcd/pkg/runtime/events"
	feathelper "github.com/fluxcd/pkg/runtime/features"
	"github.com/fluxcd/pkg/runtime/jitter"
	"github.com/fluxcd/pkg/runtime/leaderelection"
	"github.com/fluxcd/pkg/runtime/logger"
	"github.com/fluxcd/pkg/runtime/metrics"
	"github.com/fluxcd/pkg/runtime/pprof"
	"github.com/fluxcd/pkg/runtime/probes"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/fluxcd/source-controller/internal/controller"
	"github.com/fluxcd/source-controller/internal/features"
)

const controllerName = "source-controller"

var (
	scheme   = runtime.NewScheme()
	setupLog = ctrl.Log.WithName("setup")
)

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(sourcev1.AddToScheme(scheme))
}

func fail(err error, msg string) {
	setupLog.Error(err, msg)
	os.Exit(1)
}

func main() {
	var (
		metricsAddr           string
		eventsAddr            string
		healthAddr            string
		concurrent            int
		requeueDependency     time.Duration
		artifactOptions       artcfg.Options
		clientOptions         client.Options
		logOptions            logger.Options
		leaderElectionOptions leaderelection.Options
		rateLimiterOptions    helper.RateLimiterOptions
		featureGates          feathelper.FeatureGates
		watchOptions          helper.WatchOptions
		intervalJitterOptions jitter.IntervalOptions
		tokenCacheOptions     pkgcache.TokenFlags
		defaultServiceAccount string
	)
	flag.StringVar(&metricsAddr, "metrics-addr", envOrDefault("METRICS_ADDR", ":8080"),
		"The address the metric endpoint binds to.")
	flag.StringVar(&eventsAddr, "events-addr", envOrDefault("EVENTS_ADDR", ""),
		"The address of the events receiver.")
	flag.StringVar(&healthAddr, "health-addr", ":9440", "The address the health endpoint binds to.")
	flag.IntVar(&concurrent, "concurrent", 2, "The number of concurrent reconciles per controller.")
	flag.DurationVar(&requeueDependency, "requeue-dependency", 30*time.Second,
		"The interval at which failing dependencies are reevaluated.")
	flag.StringSliceVar(&git.KexAlgos, "ssh-kex-algos", []string{},
		"The list of key exchange algorithms to use for ssh connections.")
	flag.StringSliceVar(&git.HostKeyAlgos, "ssh-hostkey-algos", []string{},
		"The list of hostkey algorithms to use for ssh connections.")
	flag.StringVar(&defaultServiceAccount, auth.ControllerFlagDefaultServiceAccount, "",
		"Default service account to use for workload identity when not specified in resources.")
	artifactOptions.BindFlags(flag.CommandLine)
	clientOptions.BindFlags(flag.CommandLine)
	logOptions.BindFlags(flag.CommandLine)
	leaderElectionOptions.BindFlags(flag.CommandLine)
	rateLimiterOptions.BindFlags(flag.CommandLine)
	featureGates.BindFlags(flag.CommandLine)
	watchOptions.BindFlags(flag.CommandLine)
	intervalJitterOptions.BindFlags(flag.CommandLine)
	tokenCacheOptions.BindFlags(flag.CommandLine, 100)
	flag.Parse()

	logger.SetLogger(logger.NewLogger(logOptions))
	if defaultServiceAccount != "" {
		auth.SetDefaultServiceAccount(defaultServiceAccount)
	}
	if err := featureGates.WithLogger(setupLog).SupportedFeatures(features.FeatureGates()); err != nil {
		fail(err, "unable to load feature gates")
	}
	switch enabled, err := features.Enabled(auth.FeatureGateObjectLevelWorkloadIdentity); {
	case err != nil:
		fail(err, "unable to check feature gate "+auth.FeatureGateObjectLevelWorkloadIdentity)
	case enabled:
		auth.EnableObjectLevelWorkloadIdentity()
	}
	if auth.InconsistentObjectLevelConfiguration() {
		fail(auth.ErrInconsistentObjectLevelConfiguration, "invalid configuration")
	}
	if err := intervalJitterOptions.SetGlobalJitter(nil); err != nil {
		fail(err, "unable to set global jitter")
	}

	mgr := mustSetupManager(metricsAddr, healthAddr, concurrent, watchOptions, clientOptions,
		leaderElectionOptions)
	probes.SetupChecks(mgr, setupLog)
	recorder := helper.NewMetrics(mgr, metrics.MustMakeRecorder(), sourcev1.SourceFinalizer)
	eventRecorder, err := events.NewRecorder(mgr, ctrl.Log, eventsAddr, controllerName)
	if err != nil {
		fail(err, "unable to create event recorder")
	}
	algo, err := artdigest.AlgorithmForName(artifactOptions.ArtifactDigestAlgo)
	if err != nil {
		fail(err, "unable to configure canonical digest algorithm")
	}
	artdigest.Canonical = algo
	storage, err := artstore.New(&artifactOptions)
	if err != nil {
		fail(err, "unable to configure artifact storage")
	}
	var tokenCache *pkgcache.TokenCache
	if tokenCacheOptions.MaxSize > 0 {
		tokenCache, err = pkgcache.NewTokenCache(tokenCacheOptions.MaxSize,
			pkgcache.WithMaxDuration(tokenCacheOptions.MaxDuration),
			pkgcache.WithMetricsRegisterer(ctrlmetrics.Registry),
			pkgcache.WithMetricsPrefix("gotk_token_"))
		if err != nil {
			fail(err, "unable to create token cache")
		}
	}

	ctx := ctrl.SetupSignalHandler()
	if err := (&controller.GitRepositoryReconciler{
		Client:         mgr.GetClient(),
		EventRecorder:  eventRecorder,
		Metrics:        recorder,
		Storage:        storage,
		ControllerName: controllerName,
		TokenCache:     tokenCache,
	}).SetupWithManager(mgr, controller.GitRepositoryReconcilerOptions{
		DependencyRequeueInterval: requeueDependency,
		RateLimiter:               helper.GetRateLimiter(rateLimiterOptions),
	}); err != nil {
		fail(err, "unable to create controller "+sourcev1.GitRepositoryKind)
	}

	go func() {
		// The artifact server runs on the leader, as upstream's does.
		<-mgr.Elected()
		if err := artsrv.Start(ctx, &artifactOptions); err != nil {
			fail(err, "artifact server error")
		}
	}()
	setupLog.Info("starting manager")
	if err := mgr.Start(ctx); err != nil {
		fail(err, "problem running manager")
	}
}

func mustSetupManager(metricsAddr, healthAddr string, maxConcurrent int,
	watchOpts helper.WatchOptions, clientOpts client.Options,
	leaderOpts leaderelection.Options) ctrl.Manager {
	watchNamespace := ""
	if !watchOpts.AllNamespaces {
		watchNamespace = os.Getenv("RUNTIME_NAMESPACE")
	}
	watchSelector, err := helper.GetWatchSelector(watchOpts)
	if err != nil {
		fail(err, "unable to configure watch label selector for manager")
	}
	var disableCacheFor []ctrlclient.Object
	shouldCache, err := features.Enabled(features.CacheSecretsAndConfigMaps)
	if err != nil {
		fail(err, "unable to check feature gate "+features.CacheSecretsAndConfigMaps)
	}
	if !shouldCache {
		disableCacheFor = append(disableCacheFor, &corev1.Secret{}, &corev1.ConfigMap{})
	}
	leaderElectionID := fmt.Sprintf("%s-%s", controllerName, "leader-election")
	if watchOpts.LabelSelector != "" {
		leaderElectionID = leaderelection.GenerateID(leaderElectionID, watchOpts.LabelSelector)
	}
	options := ctrl.Options{
		Scheme:                        scheme,
		HealthProbeBindAddress:        healthAddr,
		LeaderElection:                leaderOpts.Enable,
		LeaderElectionReleaseOnCancel: leaderOpts.ReleaseOnCancel,
		LeaseDuration:                 &leaderOpts.LeaseDuration,
		RenewDeadline:                 &leaderOpts.RenewDeadline,
		RetryPeriod:                   &leaderOpts.RetryPeriod,
		LeaderElectionID:              leaderElectionID,
		Logger:                        ctrl.Log,
		Client: ctrlclient.Options{
			Cache: &ctrlclient.CacheOptions{DisableFor: disableCacheFor},
		},
		Cache: ctrlcache.Options{
			ByObject: map[ctrlclient.Object]ctrlcache.ByObject{
				&sourcev1.GitRepository{}: {Label: watchSelector},
			},
		},
		Metrics: metricsserver.Options{
			BindAddress:   metricsAddr,
			ExtraHandlers: pprof.GetHandlers(),
		},
		Controller: ctrlcfg.Controller{
			RecoverPanic:            ptr.To(true),
			MaxConcurrentReconciles: maxConcurrent,
		},
	}
	if watchNamespace != "" {
		options.Cache.DefaultNamespaces = map[string]ctrlcache.Config{watchNamespace: {}}
	}
	mgr, err := ctrl.NewManager(client.GetConfigOrDie(clientOpts), options)
	if err != nil {
		fail(err, "unable to start manager")
	}
	return mgr
}

func envOrDefault(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}
