/*
 * money.c
 *		Conversion between SQL numeric amounts and the integer minor units
 *		redpacket keeps inside.  Exact both ways: an amount with more
 *		fractional digits than the activity's scale is an error, never
 *		rounded, and no float is involved anywhere.
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/fmgrprotos.h"

#include "base.h"

int64
RpScaleFactor(int scale)
{
	static const int64 factors[RP_MAX_SCALE + 1] = {1, 10, 100, 1000, 10000};

	Assert(scale >= RP_MIN_SCALE && scale <= RP_MAX_SCALE);
	return factors[scale];
}

/*
 * Validate an amount and return it in minor units.  "what" names the
 * argument in messages.
 */
static char *
RpNumericText(Numeric n)
{
	return DatumGetCString(DirectFunctionCall1(numeric_out, NumericGetDatum(n)));
}

/*
 * Validate an amount and return it in minor units.  "what" names the
 * argument in messages.
 */
int64
RpAmountToUnits(Numeric amount, int scale, const char *what)
{
	Datum		scaled;
	Datum		truncated;

	if (numeric_is_nan(amount) || numeric_is_inf(amount))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a finite number", what),
				 errdetail("Got %s.", RpNumericText(amount))));

	if (DatumGetBool(DirectFunctionCall2(numeric_le, NumericGetDatum(amount),
										 NumericGetDatum(int64_to_numeric(0)))))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be greater than zero", what),
				 errdetail("Got %s.", RpNumericText(amount))));

	scaled = DirectFunctionCall2(numeric_mul, NumericGetDatum(amount),
								 NumericGetDatum(int64_to_numeric(RpScaleFactor(scale))));
	truncated = DirectFunctionCall2(numeric_trunc, scaled, Int32GetDatum(0));
	if (!DatumGetBool(DirectFunctionCall2(numeric_eq, scaled, truncated)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s %s has more than %d fractional digits",
						what, RpNumericText(amount), scale),
				 errdetail("The activity's currency unit has %d fractional digits, and amounts are never rounded.",
						   scale)));

	if (DatumGetBool(DirectFunctionCall2(numeric_gt, scaled,
										 NumericGetDatum(int64_to_numeric(PG_INT64_MAX)))))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("%s %s is out of range", what, RpNumericText(amount)),
				 errdetail("Amounts must fit in 64-bit integer minor units at scale %d.",
						   scale)));

	return DatumGetInt64(DirectFunctionCall1(numeric_int8, scaled));
}

Numeric
RpUnitsToAmount(int64 units, int scale)
{
	return int64_div_fast_to_numeric(units, scale);
}
