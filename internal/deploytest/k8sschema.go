package deploytest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// WriteSchemas writes into dir the JSON schemas kubeconform reads with
// -schema-location 'dir/{{ .ResourceKind }}{{ .KindSuffix }}.json', from
// the Kubernetes OpenAPI v2 document at swagger (api/openapi-spec/swagger.json
// of the k8s.io/kubernetes module) and the CustomResourceDefinitions in
// JSON at crds: one file per kind and version (deployment-apps-v1.json),
// each a $ref into _definitions.json, which holds every definition.
//
// The schemas are strict, as kubeconform's -strict expects: an object
// with properties admits no other field, unless Kubernetes marks it
// x-kubernetes-preserve-unknown-fields. An int-or-string field admits
// both, and any typed field admits null (a YAML key with no value), as
// the API server does.
func WriteSchemas(dir, swagger string, crds ...string) (kinds []string, err error) {
	var doc struct {
		Definitions map[string]any `json:"definitions"`
	}
	if err := readJSON(swagger, &doc); err != nil {
		return nil, err
	}
	if len(doc.Definitions) == 0 {
		return nil, fmt.Errorf("%s: no definitions", swagger)
	}
	files := map[string]string{} // file name → definition name
	for name, def := range doc.Definitions {
		m, _ := def.(map[string]any)
		gvks, _ := m["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			gvk, _ := g.(map[string]any)
			group, _ := gvk["group"].(string)
			version, _ := gvk["version"].(string)
			kind, _ := gvk["kind"].(string)
			files[schemaFile(kind, group, version)] = name
		}
		doc.Definitions[name] = strict(def)
	}
	for _, path := range crds {
		var crd struct {
			Spec struct {
				Group string `json:"group"`
				Names struct {
					Kind string `json:"kind"`
				} `json:"names"`
				Versions []struct {
					Name   string `json:"name"`
					Schema struct {
						OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
					} `json:"schema"`
				} `json:"versions"`
			} `json:"spec"`
		}
		if err := readJSON(path, &crd); err != nil {
			return nil, err
		}
		for _, v := range crd.Spec.Versions {
			if v.Schema.OpenAPIV3Schema == nil {
				return nil, fmt.Errorf("%s: version %s has no openAPIV3Schema", path, v.Name)
			}
			name := "crd." + crd.Spec.Group + "." + v.Name + "." + crd.Spec.Names.Kind
			doc.Definitions[name] = strict(v.Schema.OpenAPIV3Schema)
			files[schemaFile(crd.Spec.Names.Kind, crd.Spec.Group, v.Name)] = name
		}
	}
	if err := writeJSON(filepath.Join(dir, "_definitions.json"), map[string]any{"definitions": doc.Definitions}); err != nil {
		return nil, err
	}
	for file, name := range files {
		ref := map[string]any{"$ref": "_definitions.json#/definitions/" + name}
		if err := writeJSON(filepath.Join(dir, file), ref); err != nil {
			return nil, err
		}
		kinds = append(kinds, strings.TrimSuffix(file, ".json"))
	}
	sort.Strings(kinds)
	return kinds, nil
}

// schemaFile is the file name kubeconform looks for: the kind in lower
// case, the first label of the group (none for the core group) and the
// version, joined by dashes.
func schemaFile(kind, group, version string) string {
	suffix := ""
	if group != "" {
		suffix = "-" + strings.ToLower(strings.Split(group, ".")[0])
	}
	return strings.ToLower(kind) + suffix + "-" + strings.ToLower(version) + ".json"
}

// strict rewrites a schema node and its children in place (see
// WriteSchemas) and returns it.
func strict(node any) any {
	switch n := node.(type) {
	case []any:
		for i := range n {
			n[i] = strict(n[i])
		}
	case map[string]any:
		for k, v := range n {
			if k == "properties" || k == "definitions" || k == "patternProperties" {
				// Maps from names to schemas: rewrite each schema.
				if m, ok := v.(map[string]any); ok {
					for name, s := range m {
						m[name] = strict(s)
					}
				}
				continue
			}
			if k == "enum" || k == "required" || k == "example" || k == "default" {
				continue
			}
			n[k] = strict(v)
		}
		if n["format"] == "int-or-string" || n["x-kubernetes-int-or-string"] == true {
			delete(n, "type")
			delete(n, "format")
			n["oneOf"] = []any{
				map[string]any{"type": "string"},
				map[string]any{"type": "integer"},
				map[string]any{"type": "null"},
			}
		}
		if t, ok := n["type"].(string); ok {
			n["type"] = []any{t, "null"}
		}
		_, hasProps := n["properties"]
		_, hasAdditional := n["additionalProperties"]
		if hasProps && !hasAdditional && n["x-kubernetes-preserve-unknown-fields"] != true {
			n["additionalProperties"] = false
		}
	}
	return node
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	return nil
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
