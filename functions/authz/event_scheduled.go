package authz

import (
	"errors"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sluicehq/sluice/config"
)

// An EventBridge schedule invokes the authorizer function with a
// scheduled event (source "aws.events", detail-type "Scheduled Event"):
// the keeper of a region's global limits on an eventual table
// (docs/regions.md, "A rule's scope"). Only EventBridge and API Gateway
// may invoke the function (its resource policy), and API Gateway builds
// an authorizer event itself, so a client cannot send one.

// Scheduled event fields.
const (
	ScheduledSource     = "aws.events"
	ScheduledDetailType = "Scheduled Event"
)

// scheduledFields are the fields of a scheduled event Sluice reads.
type scheduledFields struct {
	Source     string `json:"source"`
	DetailType string `json:"detail-type"`
}

// ErrNoKeeper is returned for a scheduled event when the handler runs no
// keeper (Config.Scheduled is nil: no global limit kept as regional
// shares).
var ErrNoKeeper = errors.New("sluice: a scheduled event, but this function runs no keeper (it needs " + config.EnvTableMode + "=" + config.TableEventual + " and a rule with scope global)")

// decodeScheduled decodes a scheduled event.
func decodeScheduled(raw []byte) (*Event, error) {
	var e events.CloudWatchEvent
	if err := unmarshal(raw, &e, &scheduledFields{}); err != nil {
		return nil, err
	}
	return &Event{Kind: KindScheduled, Scheduled: &e}, nil
}
