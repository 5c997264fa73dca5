package regions

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
)

// markList is an entry's last marks, in a compact JSON form: one array
// of numbers, the first mark's N, At, Demand and Share, then each next
// mark's N, At and Share as differences from the one before, and its
// Demand. Lossless: a mark's demand is rounded where it is made
// (newMark), so every region splits an offer by the same numbers.
type markList []Mark

// markDemand is the resolution of a mark's demand (units a second).
const markDemand = 100

// newMark is region's mark for entry own with share.
func newMark(own *State, share int64) Mark {
	return Mark{N: own.Seq, At: own.At, Demand: math.Round(own.Demand*markDemand) / markDemand, Share: share}
}

// MarshalJSON encodes the marks as the type's comment says.
func (l markList) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 1+24*len(l))
	b = append(b, '[')
	var prev Mark
	for i, m := range l {
		if i > 0 {
			b = append(b, ',')
		}
		d := m
		if i > 0 {
			d.N, d.At, d.Share = m.N-prev.N, m.At-prev.At, m.Share-prev.Share
		}
		b = strconv.AppendInt(b, d.N, 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, d.At, 10)
		b = append(b, ',')
		b = strconv.AppendFloat(b, d.Demand, 'g', -1, 64)
		b = append(b, ',')
		b = strconv.AppendInt(b, d.Share, 10)
		prev = m
	}
	return append(b, ']'), nil
}

var errMarks = errors.New("regions: an entry's marks are not groups of four numbers")

// UnmarshalJSON decodes what MarshalJSON encodes.
func (l *markList) UnmarshalJSON(b []byte) error {
	var ns []json.Number
	if err := json.Unmarshal(b, &ns); err != nil {
		return err
	}
	if len(ns)%4 != 0 {
		return errMarks
	}
	out := make(markList, 0, len(ns)/4)
	var prev Mark
	for i := 0; i < len(ns); i += 4 {
		n, err1 := ns[i].Int64()
		at, err2 := ns[i+1].Int64()
		d, err3 := ns[i+2].Float64()
		s, err4 := ns[i+3].Int64()
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return errors.Join(errMarks, err)
		}
		m := Mark{N: n, At: at, Demand: d, Share: s}
		if i > 0 {
			m.N, m.At, m.Share = prev.N+n, prev.At+at, prev.Share+s
		}
		out = append(out, m)
		prev = m
	}
	*l = out
	return nil
}
