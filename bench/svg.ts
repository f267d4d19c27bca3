/** Hand-written SVG charts (no chart dependency): grouped bars with percentile marks. */

export interface Bar {
  series: string;
  value: number;
  /** Extra marks drawn on the bar, e.g. p95 and p99 over a p50 bar. */
  marks?: { label: string; value: number }[];
}

export interface BarGroup {
  label: string;
  bars: Bar[];
}

export interface ChartOptions {
  title: string;
  subtitle?: string;
  yLabel: string;
  groups: BarGroup[];
  series: string[];
  log?: boolean;
  /** Horizontal reference lines, e.g. a target ratio. */
  references?: { value: number; label: string }[];
}

const PALETTE = [
  '#1f77b4',
  '#ff7f0e',
  '#2ca02c',
  '#9467bd',
  '#8c564b',
  '#e377c2',
  '#7f7f7f',
  '#17becf',
];

function escape(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

function niceTicks(min: number, max: number, log: boolean): number[] {
  if (log) {
    const ticks: number[] = [];
    for (let e = Math.floor(Math.log10(min)); e <= Math.ceil(Math.log10(max)); e++)
      for (const m of [1, 2, 5]) {
        const v = m * 10 ** e;
        if (v >= min && v <= max) ticks.push(v);
      }
    return ticks;
  }
  const span = max - min || 1;
  const step = 10 ** Math.floor(Math.log10(span / 5));
  const nice = [1, 2, 5, 10].map((m) => m * step).find((s) => span / s <= 6) ?? step * 10;
  const ticks: number[] = [];
  for (let v = Math.ceil(min / nice) * nice; v <= max + 1e-9; v += nice)
    ticks.push(Number(v.toPrecision(6)));
  return ticks;
}

function formatTick(v: number): string {
  if (v >= 1000) return `${(v / 1000).toPrecision(3).replace(/\.?0+$/, '')}k`;
  return String(Number(v.toPrecision(3)));
}

/** Renders a grouped bar chart as a standalone SVG document. */
export function barChart(options: ChartOptions): string {
  const width = 760;
  const height = 420;
  const margin = { top: 56, right: 20, bottom: 72, left: 72 };
  const plotW = width - margin.left - margin.right;
  const plotH = height - margin.top - margin.bottom;
  const values = options.groups.flatMap((g) =>
    g.bars.flatMap((b) => [b.value, ...(b.marks ?? []).map((m) => m.value)]),
  );
  values.push(...(options.references ?? []).map((r) => r.value));
  const finite = values.filter((v) => Number.isFinite(v) && (!options.log || v > 0));
  const log = options.log ?? false;
  const maxValue = Math.max(...finite, log ? 1 : 0) * (log ? 1.5 : 1.1);
  const minValue = log ? Math.max(Math.min(...finite) / 1.5, 1e-3) : 0;
  const y = (v: number) => {
    const t = log
      ? (Math.log10(Math.max(v, minValue)) - Math.log10(minValue)) /
        (Math.log10(maxValue) - Math.log10(minValue))
      : (v - minValue) / (maxValue - minValue);
    return margin.top + plotH * (1 - t);
  };
  const parts: string[] = [];
  parts.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="12">`,
    `<rect width="100%" height="100%" fill="white"/>`,
    `<text x="${width / 2}" y="22" text-anchor="middle" font-size="16" font-weight="bold">${escape(options.title)}</text>`,
  );
  if (options.subtitle)
    parts.push(
      `<text x="${width / 2}" y="40" text-anchor="middle" fill="#555">${escape(options.subtitle)}</text>`,
    );
  for (const tick of niceTicks(minValue, maxValue, log)) {
    const ty = y(tick);
    parts.push(
      `<line x1="${margin.left}" x2="${width - margin.right}" y1="${ty}" y2="${ty}" stroke="#e5e5e5"/>`,
      `<text x="${margin.left - 6}" y="${ty + 4}" text-anchor="end" fill="#333">${formatTick(tick)}</text>`,
    );
  }
  parts.push(
    `<text transform="translate(18 ${margin.top + plotH / 2}) rotate(-90)" text-anchor="middle">${escape(options.yLabel)}${log ? ' (log scale)' : ''}</text>`,
    `<line x1="${margin.left}" x2="${margin.left}" y1="${margin.top}" y2="${margin.top + plotH}" stroke="#333"/>`,
    `<line x1="${margin.left}" x2="${width - margin.right}" y1="${margin.top + plotH}" y2="${margin.top + plotH}" stroke="#333"/>`,
  );
  const groupW = plotW / Math.max(1, options.groups.length);
  const barW = Math.min(36, (groupW * 0.8) / Math.max(1, options.series.length));
  options.groups.forEach((group, gi) => {
    const gx = margin.left + gi * groupW + (groupW - barW * options.series.length) / 2;
    options.series.forEach((series, si) => {
      const bar = group.bars.find((b) => b.series === series);
      if (!bar || !Number.isFinite(bar.value)) return;
      const x = gx + si * barW;
      const top = y(bar.value);
      const color = PALETTE[si % PALETTE.length];
      parts.push(
        `<rect x="${x + 1}" y="${top}" width="${barW - 2}" height="${margin.top + plotH - top}" fill="${color}"><title>${escape(`${series} ${group.label}: ${formatTick(bar.value)}`)}</title></rect>`,
      );
      for (const mark of bar.marks ?? []) {
        if (!Number.isFinite(mark.value)) continue;
        const my = y(mark.value);
        parts.push(
          `<line x1="${x + barW / 2}" x2="${x + barW / 2}" y1="${top}" y2="${my}" stroke="${color}" stroke-dasharray="2,2"/>`,
          `<line x1="${x + 3}" x2="${x + barW - 3}" y1="${my}" y2="${my}" stroke="#000"><title>${escape(`${series} ${group.label} ${mark.label}: ${formatTick(mark.value)}`)}</title></line>`,
        );
      }
    });
    parts.push(
      `<text x="${margin.left + gi * groupW + groupW / 2}" y="${margin.top + plotH + 18}" text-anchor="middle">${escape(group.label)}</text>`,
    );
  });
  for (const reference of options.references ?? []) {
    const ry = y(reference.value);
    parts.push(
      `<line x1="${margin.left}" x2="${width - margin.right}" y1="${ry}" y2="${ry}" stroke="#d62728" stroke-dasharray="6,3"/>`,
      `<text x="${width - margin.right - 4}" y="${ry - 4}" text-anchor="end" fill="#d62728">${escape(reference.label)}</text>`,
    );
  }
  const legendY = height - 24;
  let lx = margin.left;
  options.series.forEach((series, si) => {
    parts.push(
      `<rect x="${lx}" y="${legendY - 10}" width="12" height="12" fill="${PALETTE[si % PALETTE.length]}"/>`,
      `<text x="${lx + 16}" y="${legendY}">${escape(series)}</text>`,
    );
    lx += 24 + series.length * 7;
  });
  parts.push('</svg>');
  return parts.join('\n') + '\n';
}

/** One panel of a {@link lineChart}: lines over a shared x axis. */
export interface LinePanel {
  yLabel: string;
  lines: { series: string; points: { x: number; y: number }[] }[];
  /** Horizontal reference lines, e.g. a goal. */
  references?: { value: number; label: string }[];
}

/** Renders panels stacked over one x axis (a run over time) as a standalone SVG document. */
export function lineChart(options: {
  title: string;
  subtitle?: string;
  xLabel: string;
  panels: LinePanel[];
}): string {
  const width = 760;
  const panelH = 150;
  const gap = 36;
  const margin = { top: 56, right: 150, bottom: 48, left: 72 };
  const plotW = width - margin.left - margin.right;
  const height = margin.top + options.panels.length * (panelH + gap) - gap + margin.bottom;
  const xs = options.panels.flatMap((p) => p.lines.flatMap((l) => l.points.map((pt) => pt.x)));
  const xMax = Math.max(1, ...xs.filter(Number.isFinite));
  const x = (v: number) => margin.left + (plotW * v) / xMax;
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="12">`,
    `<rect width="100%" height="100%" fill="white"/>`,
    `<text x="${width / 2}" y="22" text-anchor="middle" font-size="16" font-weight="bold">${escape(options.title)}</text>`,
  ];
  if (options.subtitle)
    parts.push(
      `<text x="${width / 2}" y="40" text-anchor="middle" fill="#555">${escape(options.subtitle)}</text>`,
    );
  let color = 0;
  options.panels.forEach((panel, pi) => {
    const top = margin.top + pi * (panelH + gap);
    const values = panel.lines.flatMap((l) => l.points.map((pt) => pt.y));
    values.push(...(panel.references ?? []).map((r) => r.value));
    // At least 1: a panel of zeros (no lease lost) gets a 0 to 1 axis, not one of 1e-9ths.
    const maxValue = Math.max(...values.filter(Number.isFinite), 1) * 1.1;
    const y = (v: number) => top + panelH * (1 - v / maxValue);
    for (const tick of niceTicks(0, maxValue, false)) {
      const ty = y(tick);
      parts.push(
        `<line x1="${margin.left}" x2="${margin.left + plotW}" y1="${ty}" y2="${ty}" stroke="#e5e5e5"/>`,
        `<text x="${margin.left - 6}" y="${ty + 4}" text-anchor="end" fill="#333">${formatTick(tick)}</text>`,
      );
    }
    parts.push(
      `<text transform="translate(18 ${top + panelH / 2}) rotate(-90)" text-anchor="middle">${escape(panel.yLabel)}</text>`,
      `<line x1="${margin.left}" x2="${margin.left}" y1="${top}" y2="${top + panelH}" stroke="#333"/>`,
      `<line x1="${margin.left}" x2="${margin.left + plotW}" y1="${top + panelH}" y2="${top + panelH}" stroke="#333"/>`,
    );
    for (const reference of panel.references ?? []) {
      const ry = y(reference.value);
      parts.push(
        `<line x1="${margin.left}" x2="${margin.left + plotW}" y1="${ry}" y2="${ry}" stroke="#d62728" stroke-dasharray="6,3"/>`,
        `<text x="${margin.left + plotW - 4}" y="${ry - 4}" text-anchor="end" fill="#d62728">${escape(reference.label)}</text>`,
      );
    }
    panel.lines.forEach((line, li) => {
      const stroke = PALETTE[color++ % PALETTE.length];
      const path = line.points
        .filter((pt) => Number.isFinite(pt.y))
        .map((pt, i) => `${i === 0 ? 'M' : 'L'}${x(pt.x).toFixed(1)},${y(pt.y).toFixed(1)}`)
        .join(' ');
      parts.push(
        `<path d="${path}" fill="none" stroke="${stroke}" stroke-width="1.5"/>`,
        `<rect x="${margin.left + plotW + 12}" y="${top + 8 + li * 18}" width="12" height="3" fill="${stroke}"/>`,
        `<text x="${margin.left + plotW + 28}" y="${top + 13 + li * 18}">${escape(line.series)}</text>`,
      );
    });
  });
  const bottom = height - margin.bottom;
  for (const tick of niceTicks(0, xMax, false))
    parts.push(
      `<text x="${x(tick)}" y="${bottom + 16}" text-anchor="middle" fill="#333">${formatTick(tick)}</text>`,
    );
  parts.push(
    `<text x="${margin.left + plotW / 2}" y="${bottom + 36}" text-anchor="middle">${escape(options.xLabel)}</text>`,
    '</svg>',
  );
  return parts.join('\n') + '\n';
}
