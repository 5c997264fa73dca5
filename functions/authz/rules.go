package authz

import _ "embed"

// DefaultRules is the embedded default rules document (rules.yaml): what
// the authorizer applies when no rules source is configured.
//
//go:embed rules.yaml
var DefaultRules []byte
