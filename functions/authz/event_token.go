package authz

import (
	"github.com/aws/aws-lambda-go/events"

	"github.com/sluicehq/sluice/policy"
)

// tokenFields are the fields of a TOKEN event Sluice reads.
type tokenFields struct {
	AuthorizationToken string `json:"authorizationToken"`
	MethodArn          string `json:"methodArn"`
}

// decodeToken decodes a REST API TOKEN authorizer event. The method, path
// and stage come from its methodArn; it carries no source IP, headers,
// query, API key or route.
func decodeToken(raw []byte) (*Event, error) {
	var e events.APIGatewayCustomAuthorizerRequest
	if err := unmarshal(raw, &e, &tokenFields{}); err != nil {
		return nil, err
	}
	ev := &Event{Kind: KindToken, ARN: e.MethodArn}
	if err := checkARN(KindToken, "methodArn", e.MethodArn); err != nil {
		return nil, err
	}
	req := &ev.Request
	req.Stage, req.Method, req.Path, _ = parseMethodARN(e.MethodArn)
	req.Token = policy.Credential(e.AuthorizationToken)
	req.Absent = policy.AttrSourceIP | policy.AttrHeaders | policy.AttrQuery | policy.AttrAPIKey | policy.AttrRouteKey
	if req.Token == "" {
		return nil, ErrUnauthorized
	}
	return ev, nil
}
