"""The attention view's inline script (plain JavaScript, no library): see :mod:`anchorlens.views.page`.

ROOT and DATA are replaced by the view's DOM id and its JSON data."""

SCRIPT = r"""
(function(){
"use strict";
const root=document.getElementById(ROOT), D=DATA, C=D.checkpoints, $=s=>root.querySelector(s);
if(typeof DecompressionStream==='undefined'){$('.alv-note').textContent='This browser cannot unpack the maps (no DecompressionStream): the static image stays.';return;}
$('.alv-static').style.display='none'; $('.alv-live').style.display='block';
const MAXPX=D.max_px, CACHE=24, LOGF=D.log_floor;
const rgb=h=>[parseInt(h.slice(1,3),16),parseInt(h.slice(3,5),16),parseInt(h.slice(5,7),16)];
const SEQ=D.lut.map(rgb), DIV=D.dlut.map(rgb), MASK=[rgb('#e4e4e4'),rgb('#a8a8a8')], NOPE=[rgb('#fbf3dc'),rgb('#b8862b')];
const MASK_CSS='repeating-linear-gradient(135deg,#e4e4e4 0 3px,#a8a8a8 3px 4px)';
const NOPE_CSS='radial-gradient(circle,#b8862b 1px,#fbf3dc 1.5px) 0 0/4px 4px';
const S={a:0,b:C.length>1?1:0,mode:'map',sel:new Set(),focus:null,pinned:false,role:-1,dir:'from',scale:'sqrt'};
const all=c=>{const s=new Set();for(let l=0;l<c.layers.length;l++)for(let h=0;h<c.heads.length;h++)s.add(l+':'+h);return s;};
S.sel=all(C[0]);
// ---------- data ----------
function bytes(s){const b=atob(s),a=new Uint8Array(b.length);for(let i=0;i<b.length;i++)a[i]=b.charCodeAt(i);return a;}
async function inflate(s){return new Response(new Blob([bytes(s)]).stream().pipeThrough(new DecompressionStream('deflate'))).arrayBuffer();}
const cache=new Map(), thumbs=[];
async function full(ci,key){const id=ci+'|'+key;
 if(cache.has(id)){const v=cache.get(id);cache.delete(id);cache.set(id,v);return v;}
 const c=C[ci],Q=c.q.length,K=c.k.length,u=new Uint8Array(await inflate(c.full[key])),half=u.length/2,v=new Float32Array(Q*K).fill(NaN);
 let n=0;for(let q=0;q<Q;q++){const end=c.causal?q+1:K;for(let k=0;k<end;k++,n++){const x=(u[n]*256+u[half+n])/D.code_max;v[q*K+k]=x*x*D.vmax;}}
 cache.set(id,v);if(cache.size>CACHE)cache.delete(cache.keys().next().value);return v;}
async function thumbsOf(ci){if(!thumbs[ci])thumbs[ci]=new Uint8Array(await inflate(C[ci].thumbs));return thumbs[ci];}
function tval(u,c,l,h,i,j){const x=u[((l*(c.heads.length+1))+h)*c.tq*c.tk+i*c.tk+j];if(x===255)return NaN;const f=x/254;return f*f*D.tvmax;}
const blocksOf=(n,t)=>Array.from({length:n},(_,i)=>Math.floor(i*t/n));
const pairsOf=sel=>[...sel].map(s=>s.split(':').map(Number));
function selKey(c,p){const L=c.layers.length,H=c.heads.length;if(p.length===L*H)return 'all';if(p.length===1)return 'L'+p[0][0]+'H'+p[0][1];
 if(p.length===H&&p.every(x=>x[0]===p[0][0]))return 'L'+p[0][0];if(p.length===L&&p.every(x=>x[1]===p[0][1]))return 'H'+p[0][1];return null;}
function selName(c,p){const key=selKey(c,p);
 if(key==='all')return 'mean over all '+p.length+' heads of '+c.layers.length+' layers';
 if(key&&key.startsWith('H'))return 'head '+c.heads[p[0][1]]+', mean over '+c.layers.length+' layers';
 if(key&&!key.includes('H'))return 'layer '+c.layers[p[0][0]]+', mean over '+c.heads.length+' heads';
 if(p.length===1)return 'layer '+c.layers[p[0][0]]+' · head '+c.heads[p[0][1]];
 const names=p.slice().sort((x,y)=>x[0]-y[0]||x[1]-y[1]).map(([l,h])=>'L'+c.layers[l]+'H'+c.heads[h]);
 return 'mean of '+p.length+' heads ('+(names.length>8?names.slice(0,8).join(', ')+', …':names.join(', '))+')';}
async function mapOf(ci){const c=C[ci],Q=c.q.length,K=c.k.length,p=pairsOf(S.sel),key=selKey(c,p);
 if(key&&c.full[key])return {v:await full(ci,key),full:true};
 if(p.every(([l,h])=>c.full['L'+l+'H'+h])){const v=new Float32Array(Q*K);
  for(const [l,h] of p){const w=await full(ci,'L'+l+'H'+h);for(let i=0;i<v.length;i++)v[i]+=w[i];}
  for(let i=0;i<v.length;i++)v[i]/=p.length;return {v,full:true};}
 const u=await thumbsOf(ci),L=c.layers.length,H=c.heads.length;
 const slots=key==='all'?[[L,H]]:key&&key[0]==='H'?[[L,p[0][1]]]:key&&!key.includes('H')?[[p[0][0],H]]:p;
 const tv=new Float32Array(c.tq*c.tk);
 for(const [l,h] of slots)for(let i=0;i<c.tq;i++)for(let j=0;j<c.tk;j++)tv[i*c.tk+j]+=tval(u,c,l,h,i,j)/slots.length;
 const bq=blocksOf(Q,c.tq),bk=blocksOf(K,c.tk),v=new Float32Array(Q*K);
 for(let q=0;q<Q;q++)for(let k=0;k<K;k++)v[q*K+k]=(c.causal&&k>q)?NaN:tv[bq[q]*c.tk+bk[k]];
 return {v,full:false,block:[Math.ceil(Q/c.tq),Math.ceil(K/c.tk)]};}
function emptyRows(v,nr,nc){const e=new Uint8Array(nr);for(let r=0;r<nr;r++){let any=false;for(let c=0;c<nc;c++){const x=v[r*nc+c];if(x>0){any=true;break;}}e[r]=any?0:1;}return e;}
function pair(i,j){const p=D.pairs[i+','+j];if(p)return p;const q=D.pairs[j+','+i];return {qa:q.qb,qb:q.qa,ka:q.kb,kb:q.ka};}
const same=(x,y)=>x.length===y.length&&x.every((v,i)=>v===y[i]);
const diffable=()=>C.length>1&&S.a!==S.b&&same(C[S.a].layers,C[S.b].layers)&&same(C[S.a].heads,C[S.b].heads);
// kind: 0 value, 1 masked (n/a), 2 no counterpart, 3 empty row (n/a)
async function grid(){const A=C[S.a],a=await mapOf(S.a),QA=A.q.length,KA=A.k.length;
 if(S.mode!=='diff'||!diffable()){const ea=emptyRows(a.v,QA,KA),kind=new Uint8Array(QA*KA);
  for(let r=0;r<QA;r++)for(let c=0;c<KA;c++){const i=r*KA+c;kind[i]=ea[r]?3:isNaN(a.v[i])?1:0;}
  return {nr:QA,nc:KA,v:a.v,kind,rows:A.q,cols:A.k,diff:false,full:a.full,block:a.block,self:A.causal||same(A.q.map(t=>t[0]),A.k.map(t=>t[0]))};}
 const B=C[S.b],b=await mapOf(S.b),KB=B.k.length,al=pair(S.a,S.b),nr=al.qa.length,nc=al.ka.length;
 const ea=emptyRows(a.v,QA,KA),eb=emptyRows(b.v,B.q.length,KB),v=new Float32Array(nr*nc).fill(NaN),kind=new Uint8Array(nr*nc);
 for(let r=0;r<nr;r++){const qa=al.qa[r],qb=al.qb[r];for(let c=0;c<nc;c++){const ka=al.ka[c],kb=al.kb[c],i=r*nc+c;
  if(qa<0||qb<0||ka<0||kb<0){kind[i]=2;continue;}
  if(ea[qa]||eb[qb]){kind[i]=3;continue;}
  const x=a.v[qa*KA+ka],y=b.v[qb*KB+kb];if(isNaN(x)||isNaN(y)){kind[i]=1;continue;}v[i]=x-y;}}
 const lab=(xa,xb,TA,TB)=>xa.map((ia,n)=>ia>=0?TA[ia]:TB[xb[n]]);
 let dmax=0;for(let i=0;i<v.length;i++)if(kind[i]===0)dmax=Math.max(dmax,Math.abs(v[i]));
 return {nr,nc,v,kind,rows:lab(al.qa,al.qb,A.q,B.q),cols:lab(al.ka,al.kb,A.k,B.k),diff:true,full:a.full&&b.full,block:a.block||b.block,
  dmax:dmax>0?dmax:1e-6,self:A.causal&&B.causal,qa:al.qa,qb:al.qb,ka:al.ka,kb:al.kb};}
// ---------- colour ----------
function frac(x){if(!(x>0))return 0;const s=S.scale;if(s==='linear')return Math.min(1,x/D.vmax);if(s==='sqrt')return Math.min(1,Math.sqrt(x/D.vmax));
 const lo=D.vmax*LOGF;return Math.max(0,Math.min(1,Math.log(x/lo)/Math.log(D.vmax/lo)));}
const lut=(T,t)=>T[Math.min(T.length-1,Math.max(0,Math.round(t*(T.length-1))))];
const css=c=>'rgb('+c[0]+','+c[1]+','+c[2]+')';
const fmt=x=>Math.abs(x)>=0.01||x===0?x.toFixed(3):x.toPrecision(2);
function colorbar(cv,ticks,pos,lutT){const g=cv.getContext('2d'),w=cv.width,h=cv.height,bar=h-44;g.clearRect(0,0,w,h);
 for(let y=0;y<bar;y++){g.fillStyle=css(lut(lutT,1-y/(bar-1)));g.fillRect(0,y+6,14,1);}
 g.fillStyle='#222';g.font='11px sans-serif';g.textBaseline='middle';
 for(const t of ticks){const y=6+(1-pos(t))*(bar-1);g.fillRect(14,y,4,1);g.fillText(fmt(t),21,y);}
 const sw=(y,P,name)=>{for(let i=0;i<14;i++)for(let j=0;j<10;j++){const c=P===NOPE?P[i%3===0&&j%3===0?1:0]:P[(i+j)%4===0?1:0];g.fillStyle=css(c);g.fillRect(i,y+j,1,1);}g.fillStyle='#222';g.fillText(name,21,y+5);};
 sw(h-34,MASK,'n/a (masked)');if(G&&G.diff)sw(h-18,NOPE,'no counterpart');}
// ---------- main map ----------
const cv=$('.alv-map'),ov=$('.alv-over'),ctx=cv.getContext('2d'),octx=ov.getContext('2d'),tip=$('.alv-tip');
let G=null,geo=null;
function labelPad(list){let m=0;for(const t of list)m=Math.max(m,t[0].length);return Math.min(150,8+6.2*m);}
function draw(){const g=G,px=Math.max(1,Math.min(16,Math.floor(MAXPX/Math.max(g.nr,g.nc,1))));
 const pl=labelPad(g.rows),pt=labelPad(g.cols);geo={px,pl,pt};
 cv.width=ov.width=Math.ceil(pl+g.nc*px+4);cv.height=ov.height=Math.ceil(pt+g.nr*px+4);
 ctx.fillStyle='#fff';ctx.fillRect(0,0,cv.width,cv.height);
 if(g.nr&&g.nc){const img=ctx.createImageData(g.nc*px,g.nr*px),d=img.data,W=g.nc*px;
 for(let r=0;r<g.nr;r++)for(let c=0;c<g.nc;c++){const i=r*g.nc+c,k=g.kind[i];
  const col=k===0?(g.diff?lut(DIV,0.5+0.5*g.v[i]/g.dmax):lut(SEQ,frac(g.v[i]))):null,dots=k===2;
  for(let y=r*px;y<(r+1)*px;y++)for(let x=c*px;x<(c+1)*px;x++){const o=(y*W+x)*4,cc=col||(dots?NOPE[x%3===0&&y%3===0?1:0]:MASK[(x+y)%4===0?1:0]);d[o]=cc[0];d[o+1]=cc[1];d[o+2]=cc[2];d[o+3]=255;}}
 ctx.putImageData(img,Math.round(pl),Math.round(pt));}
 ctx.font=Math.max(8,Math.min(11,px))+'px sans-serif';ctx.textBaseline='middle';const step=Math.max(1,Math.ceil(10/px));
 ctx.textAlign='right';for(let r=0;r<g.nr;r+=step){ctx.fillStyle=D.colors[g.rows[r][1]];ctx.fillText(g.rows[r][0],Math.round(pl)-3,Math.round(pt)+r*px+px/2);}
 for(let c=0;c<g.nc;c+=step){ctx.save();ctx.translate(Math.round(pl)+c*px+px/2,Math.round(pt)-3);ctx.rotate(-Math.PI/2);ctx.textAlign='left';
  ctx.fillStyle=D.colors[g.cols[c][1]];ctx.fillText(g.cols[c][0],0,0);ctx.restore();}
 const cb=$('.alv-cbar');
 if(g.diff){colorbar(cb,[-g.dmax,0,g.dmax],t=>0.5+0.5*t/g.dmax,DIV);
  $('.alv-cbname').textContent='Δ attention probability, '+C[S.a].name+' − '+C[S.b].name+' (linear, symmetric around 0, ±'+fmt(g.dmax)+')';}
 else{const lo=D.vmax*LOGF,ticks=S.scale==='log'?[lo,Math.sqrt(lo*D.vmax),D.vmax]:S.scale==='sqrt'?[0,D.vmax/16,D.vmax/4,D.vmax]:[0,D.vmax/2,D.vmax];
  colorbar(cb,ticks,t=>frac(Math.max(t,1e-30)),SEQ);
  $('.alv-cbname').textContent='attention probability ('+S.scale+' scale, 0 – '+fmt(D.vmax)+', one scale for every layer, head and checkpoint)';}
 const c=C[S.a],p=pairsOf(S.sel);
 $('.alv-what').textContent=(g.diff?C[S.a].name+' − '+C[S.b].name:c.name)+' · '+selName(c,p)+' · queries on rows, keys on columns'+
  (g.full?'':' · block means of '+g.block[0]+'×'+g.block[1]+' tokens (not sent at full resolution; see max_bytes / layers)');}
function overlay(){octx.clearRect(0,0,ov.width,ov.height);const f=S.focus,g=G;if(!f||!geo)return;const {px,pl,pt}=geo,x0=Math.round(pl),y0=Math.round(pt),W=g.nc*px,H=g.nr*px;
 octx.fillStyle='rgba(255,255,255,0.6)';octx.fillRect(x0,y0,W,H);
 if(f.r>=0)octx.clearRect(x0,y0+f.r*px,W,px);if(f.c>=0)octx.clearRect(x0+f.c*px,y0,px,H);
 octx.strokeStyle='#c00';octx.lineWidth=1;if(f.r>=0)octx.strokeRect(x0-0.5,y0+f.r*px-0.5,W+1,px+1);if(f.c>=0)octx.strokeRect(x0+f.c*px-0.5,y0-0.5,px+1,H+1);
 octx.fillStyle='#c00';if(f.r>=0)octx.fillRect(0,y0+f.r*px,3,Math.max(px,2));if(f.c>=0)octx.fillRect(x0+f.c*px,0,Math.max(px,2),3);}
function cellAt(e){const b=ov.getBoundingClientRect(),x=(e.clientX-b.left)*ov.width/b.width,y=(e.clientY-b.top)*ov.height/b.height,{px,pl,pt}=geo;
 return {r:Math.floor((y-Math.round(pt))/px),c:Math.floor((x-Math.round(pl))/px),inL:x<pl,inT:y<pt};}
function describe(r,c){const g=G,i=r*g.nc+c,k=g.kind[i],q=g.rows[r],kk=g.cols[c];
 const head='query “'+q[0]+'” (#'+r+', '+D.roles[q[1]]+') → key “'+kk[0]+'” (#'+c+', '+D.roles[kk[1]]+'): ';
 if(k===1)return head+'n/a (masked: the query cannot see this key)';if(k===3)return head+'n/a (this query attends to no key: fully masked row)';
 if(k===2)return head+'n/a (no counterpart: the position exists in one checkpoint only)';
 return head+(g.diff?'Δ '+(g.v[i]>=0?'+':'')+shown(g.v[i]):shown(g.v[i]))+(g.full?'':' (block mean)');}
// a value to the digits its 12-bit code carries: 3 significant digits, 2 where the code step is over 0.5 %
const shown=x=>x===0?'0':(Math.sqrt(D.vmax/Math.abs(x))/D.code_max>0.005?x.toPrecision(2):x.toPrecision(3));
ov.addEventListener('mousemove',e=>{if(!G||!geo)return;const {r,c,inL,inT}=cellAt(e),g=G;
 if(inL&&r>=0&&r<g.nr){if(!S.pinned)setFocus(r,g.self?r:-1);tip.textContent='token “'+g.rows[r][0]+'” (#'+r+', '+D.roles[g.rows[r][1]]+')';return;}
 if(inT&&c>=0&&c<g.nc){if(!S.pinned)setFocus(g.self?c:-1,c);tip.textContent='token “'+g.cols[c][0]+'” (#'+c+', '+D.roles[g.cols[c][1]]+')';return;}
 if(r<0||c<0||r>=g.nr||c>=g.nc){tip.textContent='';return;}
 if(!S.pinned)setFocus(r,c);tip.textContent=describe(r,c);});
ov.addEventListener('click',e=>{if(!G)return;const {r,c,inL,inT}=cellAt(e),g=G;S.pinned=!S.pinned;
 if(S.pinned){if(inL&&r>=0&&r<g.nr)setFocus(r,g.self?r:-1);else if(inT&&c>=0&&c<g.nc)setFocus(g.self?c:-1,c);else if(r>=0&&c>=0&&r<g.nr&&c<g.nc)setFocus(r,c);}});
// ---------- text view ----------
const tx=$('.alv-text'),tcb=$('.alv-tbar');let spans=[],textKey='',textVals=null;
function buildText(){const g=G,toks=S.dir==='from'?g.cols:g.rows,key=S.a+'|'+S.b+'|'+g.diff+'|'+S.dir+'|'+toks.length;
 if(key===textKey)return;textKey=key;tx.textContent='';spans=[];const frag=document.createDocumentFragment();
 toks.forEach((t,i)=>{const s=document.createElement('span');s.className='alv-tok';s.dataset.i=i;s.textContent=t[0];
  s.style.borderBottom='3px solid '+D.colors[t[1]];frag.appendChild(s);spans.push(s);});tx.appendChild(frag);}
tx.addEventListener('mouseover',e=>{const t=e.target.closest('.alv-tok');if(!t||S.pinned)return;const i=+t.dataset.i;
 if(S.role>=0){S.role=-1;$('.alv-role').value='-1';}setFocus(G.self||S.dir==='from'?i:-1,G.self||S.dir==='to'?i:-1);});
tx.addEventListener('click',e=>{const t=e.target.closest('.alv-tok');if(!t)return;const i=+t.dataset.i;S.pinned=true;S.role=-1;$('.alv-role').value='-1';
 setFocus(G.self||S.dir==='from'?i:-1,G.self||S.dir==='to'?i:-1);});
function values(){const g=G,n=S.dir==='from'?g.nc:g.nr,vals=new Float32Array(n).fill(NaN);let name='';
 const ok=i=>g.kind[i]===0;
 if(S.role>=0){const R=S.role,rn=D.roles[R];
  if(S.dir==='from'){for(let c=0;c<g.nc;c++){let s=0,m=0;for(let r=0;r<g.nr;r++)if(g.rows[r][1]===R&&ok(r*g.nc+c)){s+=g.v[r*g.nc+c];m++;}if(m)vals[c]=s/m;}
   name=(g.diff?'Δ ':'')+'mean attention probability from the '+rn+' queries (that can see the key) to each token';}
  else{for(let r=0;r<g.nr;r++){let s=0,m=0;for(let c=0;c<g.nc;c++)if(g.cols[c][1]===R&&ok(r*g.nc+c)){s+=g.v[r*g.nc+c];m++;}if(m)vals[r]=s;}
   name=(g.diff?'Δ ':'')+'attention mass each query gives the '+rn+' keys (sum over them)';}}
 else if(S.focus){const f=S.focus;
  if(S.dir==='from'&&f.r>=0){for(let c=0;c<g.nc;c++)if(ok(f.r*g.nc+c))vals[c]=g.v[f.r*g.nc+c];name=(g.diff?'Δ ':'')+'attention probability from query “'+g.rows[f.r][0]+'” (#'+f.r+') to each token';}
  if(S.dir==='to'&&f.c>=0){for(let r=0;r<g.nr;r++)if(ok(r*g.nc+f.c))vals[r]=g.v[r*g.nc+f.c];name=(g.diff?'Δ ':'')+'attention probability from each token to key “'+g.cols[f.c][0]+'” (#'+f.c+')';}}
 return {vals,name};}
function colourText(){const g=G,{vals,name}=values();textVals=vals;let m=0;for(const x of vals)if(!isNaN(x))m=Math.max(m,Math.abs(x));m=m>0?m:1e-6;
 const kinds=S.dir==='from'?(g.diff?g.ka:null):(g.diff?g.qa:null),kb=S.dir==='from'?(g.diff?g.kb:null):(g.diff?g.qb:null);
 const f=S.focus,fi=f?(S.dir==='from'?f.r:f.c):-1;
 spans.forEach((s,i)=>{const x=vals[i];let bg,fg='#111';
  if(kinds&&(kinds[i]<0||kb[i]<0))bg=NOPE_CSS;else if(isNaN(x))bg=name?MASK_CSS:'transparent';
  else{const c=g.diff?lut(DIV,0.5+0.5*x/m):lut(SEQ,Math.sqrt(Math.max(0,x)/m));bg=css(c);if(0.299*c[0]+0.587*c[1]+0.114*c[2]<120)fg='#fff';}
  s.style.background=bg;s.style.color=fg;s.style.outline=S.role<0&&i===fi?'2px solid #c00':'none';
  s.title=s.textContent+' · '+D.roles[(S.dir==='from'?g.cols:g.rows)[i][1]]+' · '+(isNaN(x)?'n/a':(g.diff&&x>=0?'+':'')+x.toPrecision(3));});
 const none=!vals.some(x=>!isNaN(x));$('.alv-tname').textContent=name&&none?name+': n/a (masked, empty or no counterpart)':name?name+(g.diff?' (linear, symmetric ±'+fmt(m)+')':' (sqrt scale, 0 – '+fmt(m)+')'):'hover or click a token, or choose a role';
 const t=tcb.getContext('2d'),w=tcb.width;t.clearRect(0,0,w,tcb.height);for(let x=0;x<w-40;x++){t.fillStyle=css(g.diff?lut(DIV,x/(w-41)):lut(SEQ,x/(w-41)));t.fillRect(x,0,1,10);}
 t.fillStyle='#222';t.font='10px sans-serif';t.textBaseline='top';t.textAlign='center';
 const ticks=g.diff?[-m,0,m]:[0,m/4,m],pos=g.diff?(x=>0.5+0.5*x/m):(x=>Math.sqrt(x/m));ticks.forEach((v,n)=>{const x=pos(v)*(w-41);t.fillRect(x,10,1,3);t.textAlign=n===0?'left':n===ticks.length-1?'right':'center';t.fillText(fmt(v),x,14);});}
function setFocus(r,c){const f=S.focus;if(f&&f.r===r&&f.c===c)return;S.focus={r,c};overlay();colourText();}
// ---------- thumbnails ----------
const th=$('.alv-thumbs');let thumbKey=-1,thumbCells=[];
async function buildThumbs(){if(thumbKey===S.a)return;thumbKey=S.a;const c=C[S.a],u=await thumbsOf(S.a),L=c.layers.length,H=c.heads.length;
 th.textContent='';thumbCells=[];th.style.gridTemplateColumns='auto repeat('+(H+1)+',auto)';
 const cell=(txt,cls)=>{const d=document.createElement('div');d.textContent=txt;d.className=cls||'alv-th-l';th.appendChild(d);};
 cell('');c.heads.forEach(h=>cell('H'+h));cell('mean');
 for(let l=0;l<=L;l++){cell(l<L?'L'+c.layers[l]:'mean');for(let h=0;h<=H;h++){const t=document.createElement('canvas');t.width=c.tk;t.height=c.tq;t.className='alv-th';
  const pairs=l<L&&h<H?[[l,h]]:l<L?c.heads.map((_,j)=>[l,j]):h<H?c.layers.map((_,i)=>[i,h]):pairsOf(all(c));
  t.dataset.l=l;t.dataset.h=h;t.title=selName(c,pairs);
  const g=t.getContext('2d'),img=g.createImageData(c.tk,c.tq);
  for(let i=0;i<c.tq;i++)for(let j=0;j<c.tk;j++){const x=tval(u,c,l,h,i,j),o=(i*c.tk+j)*4,cc=isNaN(x)?MASK[(i+j)%4===0?1:0]:lut(SEQ,Math.sqrt(Math.max(0,x)/D.tvmax));
   img.data[o]=cc[0];img.data[o+1]=cc[1];img.data[o+2]=cc[2];img.data[o+3]=255;}
  g.putImageData(img,0,0);t.addEventListener('click',e=>{const keys=pairs.map(p=>p[0]+':'+p[1]);
   if(e.shiftKey||e.ctrlKey||e.metaKey){if(keys.every(k=>S.sel.has(k))){if(keys.length<S.sel.size)keys.forEach(k=>S.sel.delete(k));}else keys.forEach(k=>S.sel.add(k));}
   else S.sel=new Set(keys);render();});
  th.appendChild(t);thumbCells.push([t,pairs]);}}}
function markThumbs(){const c=C[S.a],key=selKey(c,pairsOf(S.sel)),agg=key&&key.includes('H')&&key[0]==='L'?null:key;
 for(const [t,pairs] of thumbCells){const single=pairs.length===1&&!(c.layers.length===1&&c.heads.length===1)&&+t.dataset.l<c.layers.length&&+t.dataset.h<c.heads.length;
  const on=agg?(!single&&pairs.length===S.sel.size&&pairs.every(p=>S.sel.has(p[0]+':'+p[1]))):(single&&S.sel.has(pairs[0][0]+':'+pairs[0][1]));
  t.classList.toggle('alv-on',on);}}
// ---------- controls ----------
const sa=$('.alv-a'),sb=$('.alv-b'),sm=$('.alv-mode');
C.forEach((c,i)=>{sa.add(new Option(c.name,i));sb.add(new Option(c.name,i));});sa.value=S.a;sb.value=S.b;
if(C.length<2)$('.alv-cmp').style.display='none';
D.roles.forEach((r,i)=>$('.alv-role').add(new Option('role: '+r,i)));
sa.onchange=()=>{S.a=+sa.value;S.sel=all(C[S.a]);render();};sb.onchange=()=>{S.b=+sb.value;render();};
sm.onchange=()=>{S.mode=sm.value;render();};
$('.alv-scale').onchange=e=>{S.scale=e.target.value;render();};
$('.alv-dir').onchange=e=>{S.dir=e.target.value;render();};
$('.alv-role').onchange=e=>{S.role=+e.target.value;S.pinned=false;colourText();};
$('.alv-all').onclick=()=>{S.sel=all(C[S.a]);render();};
$('.alv-unpin').onclick=()=>{S.pinned=false;};
// ---------- render ----------
let seq=0,pending=Promise.resolve();
function render(){const my=++seq;pending=(async()=>{
 if(S.mode==='diff'&&!diffable())$('.alv-note').textContent='difference view: choose two checkpoints with the same layers and heads';else $('.alv-note').textContent='';
 await buildThumbs();const g=await grid();if(my!==seq)return;G=g;
 if(!S.focus||S.focus.r>=g.nr||S.focus.c>=g.nc)S.focus={r:g.nr-1,c:g.self?g.nr-1:-1};
 draw();overlay();buildText();colourText();markThumbs();})().catch(err=>{$('.alv-note').textContent='view failed: '+err;throw err;});return pending;}
window.anchorlensViews=window.anchorlensViews||{};
window.anchorlensViews[ROOT]={ready:()=>pending,
 state:()=>({a:S.a,b:S.b,mode:S.mode,sel:[...S.sel].sort(),focus:S.focus,pinned:S.pinned,role:S.role,dir:S.dir,scale:S.scale}),
 grid:()=>({nr:G.nr,nc:G.nc,diff:G.diff,full:G.full,kind:Array.from(G.kind),v:Array.from(G.v,x=>isNaN(x)?null:x)}),
 text:()=>Array.from(textVals||[],x=>isNaN(x)?null:x)};
render();
})();
"""
