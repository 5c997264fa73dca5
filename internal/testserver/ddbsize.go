package testserver

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Item sizes and capacity units as DynamoDB bills them, computed from the
// wire form of items (DynamoDB JSON: {"name":{"S":"..."}}).
//
// Item size, from "DynamoDB item sizes and formats"
// (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/CapacityUnitCalculations.html):
// the sum over attributes of the UTF-8 length of the name plus the value's
// size, where a string is its UTF-8 length; a number about 1 byte per two
// significant digits plus 1 (leading and trailing zeros trimmed); a binary
// its raw (decoded) length; a null or Boolean 1 byte; a list or map 3 bytes
// plus its elements plus 1 byte per element (a map element's name counts
// too). Sets have no documented overhead: the sum of their elements.
//
// Units, from "DynamoDB read and write operations"
// (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/read-write-operations.html):
// a write unit per started 1 KB (1,024 bytes) of the larger of the item
// before and after the write, at least 1; a conditional write whose
// condition fails still consumes units for the item's size (at least 1); a
// transactional write 2 units per started KB of each item; a strongly
// consistent read 1 unit per started 4 KB, an eventually consistent one
// half that, at least one such unit; BatchGetItem rounds each item up on its
// own, Query and Scan round the total of the items read.

// itemSize returns the size of an item (a map of attribute names to
// values). A nil item is absent: size 0.
func itemSize(item map[string]json.RawMessage) (int64, error) {
	var n int64
	for name, v := range item {
		s, err := valueSize(v)
		if err != nil {
			return 0, fmt.Errorf("attribute %q: %w", name, err)
		}
		n += int64(len(name)) + s
	}
	return n, nil
}

var errAttrValue = errors.New("testserver: malformed attribute value")

// valueSize returns the size of one attribute value ({"S":"x"} and the like)
// without its name.
func valueSize(raw json.RawMessage) (int64, error) {
	var v map[string]json.RawMessage
	if err := json.Unmarshal(raw, &v); err != nil || len(v) != 1 {
		return 0, fmt.Errorf("%w: %s", errAttrValue, raw)
	}
	for typ, x := range v {
		switch typ {
		case "S":
			var s string
			err := json.Unmarshal(x, &s)
			return int64(len(s)), err
		case "N":
			var s string
			if err := json.Unmarshal(x, &s); err != nil {
				return 0, err
			}
			return numberSize(s), nil
		case "B":
			var s string
			if err := json.Unmarshal(x, &s); err != nil {
				return 0, err
			}
			return binarySize(s)
		case "BOOL", "NULL":
			return 1, nil
		case "SS", "NS", "BS":
			var ss []string
			if err := json.Unmarshal(x, &ss); err != nil {
				return 0, err
			}
			var n int64
			for _, s := range ss {
				switch typ {
				case "SS":
					n += int64(len(s))
				case "NS":
					n += numberSize(s)
				default:
					b, err := binarySize(s)
					if err != nil {
						return 0, err
					}
					n += b
				}
			}
			return n, nil
		case "M":
			var m map[string]json.RawMessage
			if err := json.Unmarshal(x, &m); err != nil {
				return 0, err
			}
			n := int64(3)
			for k, e := range m {
				s, err := valueSize(e)
				if err != nil {
					return 0, err
				}
				n += int64(len(k)) + s + 1
			}
			return n, nil
		case "L":
			var l []json.RawMessage
			if err := json.Unmarshal(x, &l); err != nil {
				return 0, err
			}
			n := int64(3)
			for _, e := range l {
				s, err := valueSize(e)
				if err != nil {
					return 0, err
				}
				n += s + 1
			}
			return n, nil
		}
		return 0, fmt.Errorf("%w: type %q", errAttrValue, typ)
	}
	return 0, errAttrValue
}

// numberSize is a number's size: (significant digits + 1) / 2, rounded
// up, plus 1 byte. Leading and trailing zeros are not significant; the
// sign, the decimal point and an exponent take no digits.
func numberSize(s string) int64 {
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		s = s[:i]
	}
	digits := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, s)
	digits = strings.Trim(digits, "0")
	return int64(len(digits)+1)/2 + 1
}

func binarySize(s string) (int64, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	return int64(len(b)), err
}

// writeUnits is the write units of a write touching an item of size bytes
// (the larger of before and after): one per started KB, at least 1.
func writeUnits(size int64) float64 {
	return float64(max(1, (size+1023)/1024))
}

// readUnits is the read units of reading size bytes (one item, or a Query's
// total): one per started 4 KB strongly consistent, half that eventually
// consistent, at least one such unit.
func readUnits(size int64, consistent bool) float64 {
	u := float64(max(1, (size+4095)/4096))
	if !consistent {
		u /= 2
	}
	return u
}

// keyString is the identity of a key attribute value (its type and value
// text): {"S":"a"} -> "S:a". It identifies partitions and items.
func keyString(raw json.RawMessage) (string, error) {
	var v map[string]string
	if err := json.Unmarshal(raw, &v); err != nil || len(v) != 1 {
		return "", fmt.Errorf("%w: key value %s", errAttrValue, raw)
	}
	for typ, s := range v {
		return typ + ":" + s, nil
	}
	return "", errAttrValue
}

// removeMember returns the JSON object body without its top-level member
// name, byte for byte as an encoder that never wrote it would have (the
// member and one separating comma are cut; everything else is kept), and
// whether it was there.
func removeMember(body []byte, name string) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return body, false
	}
	first := true
	for dec.More() {
		start := int(dec.InputOffset()) // at the comma before a member, or after '{'
		t, err := dec.Token()
		if err != nil {
			return body, false
		}
		key, _ := t.(string)
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return body, false
		}
		end := int(dec.InputOffset())
		if key == name {
			if first {
				// "{" name:value [ws] "," rest: cut through the comma.
				rest := bytes.TrimLeft(body[end:], " \t\r\n")
				if len(rest) > 0 && rest[0] == ',' {
					end = len(body) - len(rest) + 1
				}
			}
			out := make([]byte, 0, len(body)-(end-start))
			out = append(append(out, body[:start]...), body[end:]...)
			return out, true
		}
		first = false
	}
	return body, false
}

// setMember returns the JSON object body with its top-level member name
// set to the JSON value value (replacing it if present, else appended).
func setMember(body []byte, name, value string) ([]byte, error) {
	body, _ = removeMember(body, name)
	t := bytes.TrimRight(body, " \t\r\n")
	if len(t) == 0 || t[len(t)-1] != '}' {
		return nil, fmt.Errorf("testserver: request body is not a JSON object")
	}
	inner := bytes.TrimSpace(t[1 : len(t)-1])
	key, _ := json.Marshal(name)
	out := make([]byte, 0, len(t)+len(key)+len(value)+2)
	out = append(out, t[:len(t)-1]...)
	if len(inner) > 0 {
		out = append(out, ',')
	}
	out = append(append(append(out, key...), ':'), value...)
	return append(out, '}'), nil
}
