// Package decryptor stands in for kustomize-controller's SOPS decryptor in modelpool's e2e
// build, which decrypts nothing: the tests' Kustomizations have no spec.decryption. It
// keeps upstream's API and its behaviour for a Kustomization without decryption (every
// call a no-op), and refuses one with decryption instead of leaving it undecrypted.
// Upstream's decryptor links SOPS with the key services of AWS, Azure, Google Cloud,
// HuaweiCloud, Vault, age and PGP.
package decryptor

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/resource"

	"github.com/fluxcd/pkg/cache"

	kustomizev1 "github.com/fluxcd/kustomize-controller/api/v1"
)

// ErrNotBuilt is what a Kustomization with spec.decryption gets from this build.
var ErrNotBuilt = errors.New("SOPS decryption is not built into this kustomize-controller " +
	"(modelpool's e2e build, e2e/flux/build.sh)")

// Decryptor holds what upstream's options set; it decrypts nothing.
type Decryptor struct {
	root           string
	kustomization  *kustomizev1.Kustomization
	tokenCache     *cache.TokenCache
	sopsAgeSecret  *types.NamespacedName
	vaultConfigMap *types.NamespacedName
}

// New returns a Decryptor for the Kustomization and a cleanup, as upstream's does.
func New(_ client.Client, kustomization *kustomizev1.Kustomization, opts ...Option) (*Decryptor, func(), error) {
	d := &Decryptor{kustomization: kustomization}
	for _, opt := range opts {
		opt(d)
	}
	return d, func() {}, nil
}

// IsDecryptionDisabled is upstream's: the kustomize.toolkit.fluxcd.io/decrypt annotation.
func IsDecryptionDisabled(annotations map[string]string) bool {
	return annotations != nil &&
		strings.EqualFold(annotations[fmt.Sprintf("%s/decrypt", kustomizev1.GroupVersion.Group)], kustomizev1.DisabledValue)
}

// IsEncryptedSecret is upstream's: a v1 Secret with a top-level sops field.
func IsEncryptedSecret(object *unstructured.Unstructured) bool {
	if object.GetKind() == "Secret" && object.GetAPIVersion() == "v1" {
		if _, found, _ := unstructured.NestedFieldNoCopy(object.Object, "sops"); found {
			return true
		}
	}
	return false
}

func (d *Decryptor) wanted() bool {
	return d.kustomization.Spec.Decryption != nil && d.kustomization.Spec.Decryption.Provider != ""
}

// ImportKeys refuses a Kustomization that asks for decryption.
func (d *Decryptor) ImportKeys(context.Context) error {
	if d.wanted() {
		return ErrNotBuilt
	}
	return nil
}

// SetAuthOptions has nothing to set.
func (d *Decryptor) SetAuthOptions(context.Context) {}

// DecryptSources decrypts nothing: without spec.decryption upstream's does the same.
func (d *Decryptor) DecryptSources(string) error {
	if d.wanted() {
		return ErrNotBuilt
	}
	return nil
}

// DecryptResource leaves every resource as it is, as upstream's does without spec.decryption.
func (d *Decryptor) DecryptResource(*resource.Resource) (*resource.Resource, error) {
	if d.wanted() {
		return nil, ErrNotBuilt
	}
	return nil, nil
}
