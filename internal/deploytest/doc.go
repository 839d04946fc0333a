// Package deploytest holds the tests of what ships beside the code: the
// container image (deploy/image), the Helm chart (deploy/helm/idem), the
// plain manifests rendered from it (deploy/kubernetes) and the version make
// stamps into every build. They run the real tools, which the Makefile
// provides: `make chart-test` (helm and kubeconform compiled from the Go
// module proxy into .cache/tools, the Kubernetes schemas converted from the
// OpenAPI document of the k8s.io/kubernetes module), `make image-test`
// (buildah and podman) and `make stamp-test`; `make deploy-test` runs the
// three, and `make test` runs it.
//
// This package also converts OpenAPI documents into the JSON schemas
// kubeconform reads (WriteSchemas), so that the chart is checked against
// the schemas of a pinned Kubernetes release without a network.
package deploytest
